"""Deprecated: 0.1.0's package of the common code, now ``pagesift.core``.

Only ``pagesift.shared.client`` is kept here, 0.1.0's import path of the client: it warns
and hands back ``pagesift.client``'s objects. The next minor version removes this package
(CHANGELOG.md).
"""
