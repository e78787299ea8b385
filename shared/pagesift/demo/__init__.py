"""The demo site: a generated website on loopback with a manifest of what a crawl returns.

Used by ``make run``, the drill, the tests and the bench; never by a node's job code.

- ``site``: the site on loopback and its manifest;
- ``app``: how each path of the site answers;
- ``pages``: the generated text, link graph and HTML;
- ``layout``: the fixed sections and the manifest types;
- ``launcher``: ``make run``, a local primary + standby pair under ./data and the site.
"""
