"""The primary: the job runtime and its engine, and the sending side of replication.

- ``engine``: everything job code needs from the web, behind the ``Engine`` protocol
  (HTTP, the address guard, politeness, robots, request profiles, retries, sitemaps,
  content sniffing, the worker pool);
- ``extract``: untrusted bytes into documents (HTML; PDF and office formats), run in
  workers;
- ``jobs``: the runtime (register, run, record, sweep), the frontier, Map, the page cache;
- ``models``: the model formats (json, summary, crawl prompts) through the operator's
  OpenAI-compatible model endpoint;
- ``webhooks``: the durable per-job outbox and its delivery;
- ``replication``: the ``ReplicationService`` stream.

Floors (``tests/test_layers.py``): ``engine`` and ``extract`` import nothing from ``jobs``.
"""
