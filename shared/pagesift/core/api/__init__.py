"""The public API served by both roles: ``JobService`` and what every handler shares.

- ``service``: the handlers; ``appends``: AppendBatchScrape; ``usage``:
  GetAccountUsage's answer; ``extracts``: StartExtract and GetExtract; ``previews``: a
  crawl's prompt and PreviewCrawlParams; ``ports``: what the service needs from its node;
- ``errortable``: every refusal to one gRPC status and reason; ``rpcerrors``: the rich
  details; ``adminerrors``: AdminService's and the replication stream's refusals;
- ``paging``, ``streams``: what a read returns and how much a watch may hold;
- ``interceptors``: handler rewrapping and the malformed-request guard; ``guard``: the
  metadata guard (a key or token per method prefix); ``tls``: credentials and the
  replication token;
- ``metrics``: the registry and its series; ``metricsgrpc``: every RPC counted and
  timed; ``metricshttp``: ``/metrics``; ``metricsources``: the gauges computed at scrape
  time;
- ``storagewatch``: the storage watcher and its reserve (disk full is a state), and the
  interceptor that answers STORAGE_UNAVAILABLE.
"""
