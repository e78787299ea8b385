"""The job domain both roles share: what a job is in the store and what a request may ask.

Records and their change events, quotas and accounts, URL identity and crawl scope,
caller regexes, request validation into specs, page errors, and poison-job quarantine.
"""
