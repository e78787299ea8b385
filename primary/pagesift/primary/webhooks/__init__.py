"""Signed, durable webhooks: the per-job outbox in the store and its in-order delivery."""
