"""The demo site: a generated website on loopback with a manifest of what a crawl returns.

Used by ``make run``, the drill, the tests and the bench; never by a node's job code.
``site`` serves it, ``app`` answers each path, ``pages`` generates the text and links,
``layout`` holds the fixed sections and the manifest types.
"""
