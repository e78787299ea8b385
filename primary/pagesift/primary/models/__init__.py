"""The model formats: structured data and summaries of pages from an operator's model server.

Modules, in the order a page meets them:

- ``settings``: the ``model_*`` config keys checked as one (``ModelSettings``);
- ``fairslots``: the node's model call slots, shared round-robin between accounts;
- ``endpoint``: one OpenAI-compatible chat-completions call (``ModelEndpoint``);
- ``prompts``: the messages of each task and the markdown cut to the input budget (pure);
- ``answers``: an answer parsed and judged against its JSON schema (pure);
- ``formats``: FORMAT_JSON and FORMAT_SUMMARY of a fetched page (``ModelFormats``);
- ``crawlprompt``: crawl options from words (a crawl's prompt, PreviewCrawlParams).
"""
