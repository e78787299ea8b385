"""The job runtime on the primary: register, run, record, resume, sweep.

- ``runtime``: ``Jobs``, the facade the service and the node call (register with
  idempotency, start and stop with the primary role, cancel, resume, quarantine);
- ``quarantining``: the quarantine's books ``Jobs`` keeps (run markers, interruptions
  and worker losses counted, suspects run one at a time on probation);
- ``runner``: the batch and crawl loops, attempts and retries; ``committing``: what
  ``recording`` writes committed (waiting while the store refuses), and a job's end;
- ``recording``: pure functions that add a page's, an error's or a finish's records to a
  write group (and ``charge_page``, the one place quota is charged);
- ``appending``: a batch's URL list as it grows (AppendBatchScrape's group, the run's
  queue, its end);
- ``pagedraws``: pages drawn before they are fetched (an account's daily pages exact in
  requests);
- ``activity``: per account, what this primary is doing now (unfinished jobs, pages in
  flight, the last page);
- ``clustered``: ``Jobs`` for a node in a cluster (account limits held across pairs,
  hosts owned by one pair);
- ``oneoff``: the one-off ``Scrape`` and ``Map`` calls; ``mapper``: the Map walk;
- ``frontier``: a crawl's frontier in the store; ``pagecache``: what an account fetched
  before; ``sweep``: expiry, quota pruning and cache sweeping.

Imports flow one way: runtime -> quarantining -> runner -> committing -> recording. Job
code sees the web only through ``pagesift.primary.engine.interface.Engine``
(``tests/test_layers.py``).
"""
