"""Signed, durable webhooks: the per-job outbox in the store (``outbox``) and its
in-order delivery (``delivery``)."""
