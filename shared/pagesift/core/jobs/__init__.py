"""The job domain both roles share: what a job is in the store and what a request may ask.

- ``records``: job records in the store (key layout, codecs, a group's changes to them);
  ``views``: what the API shows of a stored job; ``events``: change notification for
  job watchers, fed by the store;
- ``quota``: per-account limits at job start and rolling-day page usage; ``accounts``:
  who is calling, what they may do, who is an administrator; ``clusterlimits``: the
  port of account limits held across pairs;
- ``urls``: the host parser, page keys, URL validation; ``blockedaddresses``: which
  addresses no fetch may reach; ``scope``: which links a crawl admits; ``patterns``:
  caller regexes made safe to run;
- ``validate``: one check per request field; ``specs``: one validation call per request
  kind; ``renderoptions``: the rendering options' rules (engine, waits, actions,
  emulation, screenshots);
- ``pageerrors``: why a page could not be scraped; ``quarantine``: the poison-job
  decision and its two durable records;
- ``selectorschemas``: a selector schema's rules (FORMAT_SELECTORS);
  ``modelrequests``: what a request may ask of the model (formats, schemas, prompts);
  ``extractmerge``: an extract job's pages merged into one object;
- ``firecrawlshape``: Firecrawl's shape of documents and job states, for every
  Firecrawl-facing part.
"""
