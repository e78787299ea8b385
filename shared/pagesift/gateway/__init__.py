"""A Firecrawl-compatible HTTP gateway in front of a pagesift pair (issue 22).

A stateless aiohttp app that speaks Firecrawl's v2 HTTP API and translates each call
onto JobService through ``pagesift.client.JobClient`` (so it follows a failover of the
pair with the client's own rules). One module per concern:

- ``models``, ``optionmodels``, ``v1models``: the strict request bodies (pydantic,
  camelCase as Firecrawl spells them);
- ``translate``, ``options``, ``v1translate``: pure mapping of requests to proto
  messages (v1 through v2's meaning) and of status pages and errors lists back;
- ``httperrors``: the one table from a gRPC error to Firecrawl's HTTP status and body;
- ``bounds``: the bounds on what a caller sends (a body's JSON shape, every integer);
- ``clients``: one ``JobClient`` per API key; ``health``: the ``/healthz`` probe;
  ``metrics``: ``/metrics``; ``openapi``: ``/v2/openapi.json``; ``forwarded``: the
  absolute URLs' origin behind a trusted proxy;
- ``handling``: what every route shares (auth, body parsing, JSON answers, errors);
- ``v2``, ``v1``: each version's routes; ``jobroutes``: status, cancel and errors, which
  both share; ``watch``: the WebSocket watch of a crawl; ``team``: the account routes;
  ``unserved``: Firecrawl's routes pagesift lacks, each a 501 saying why;
  ``structured``: the json, summary, attributes and selectors formats and their
  answers; ``extractroutes``: extract and token usage;
- ``app``: the application with every route module on it; ``server``: running it, TLS
  included (``pagesift gateway``, ``serve --http-listen``).

Floor: it imports the client, the generated code, aiohttp and pydantic, never a role.
"""
