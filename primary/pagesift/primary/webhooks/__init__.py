"""Signed, durable webhooks: the per-job outbox in the store and its in-order delivery.

- ``outbox``: the per-job outbox, and what each event's POST carries (signed);
- ``delivery``: every job's outbox POSTed in order, one event in flight per job;
- ``firecrawl``: the body, headers and signature of an event in Firecrawl's shape.
"""
