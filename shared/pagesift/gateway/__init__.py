"""A Firecrawl-compatible HTTP gateway in front of a pagesift pair (issue 22).

A stateless aiohttp app that speaks Firecrawl's v2 HTTP API and translates each call
onto JobService through ``pagesift.client.JobClient`` (so it follows a failover of the
pair with the client's own rules). One module per concern:

- ``models``: the strict request bodies (pydantic, camelCase as Firecrawl spells them);
- ``translate``: pure mapping of requests to proto messages and of documents, status
  pages and errors lists back to Firecrawl's shapes;
- ``errors``: the one table from a gRPC error to Firecrawl's HTTP status and body;
- ``clients``: one ``JobClient`` per API key; ``health``: the ``/healthz`` probe;
  ``metrics``: ``/metrics``; ``openapi``: ``/v2/openapi.json``; ``forwarded``: the
  absolute URLs' origin behind a trusted proxy;
- ``handling``: what every route shares (auth, body parsing, JSON answers, errors);
- ``v2``: the v2 routes; ``app``: the application with every route module on it;
  ``server``: running it, TLS included (``pagesift gateway``, ``serve --http-listen``).

Floor: it imports the client, the generated code, aiohttp and pydantic, never a role.
"""
