"""Deprecated import path of the client: use ``pagesift.client``.

Importing this module warns (``DeprecationWarning``) and hands back the same objects as
``pagesift.client``; it is the one module left at ``pagesift.shared``'s top level, and the
next minor version removes it (CHANGELOG.md).
"""

import warnings

from pagesift.client import *  # noqa: F403
from pagesift.client import __all__ as __all__

warnings.warn(
    "pagesift.shared.client is deprecated; import from pagesift.client",
    DeprecationWarning,
    stacklevel=2,
)
