"""Deprecated import path of the client: use ``pagesift.client``.

Importing this module warns (``DeprecationWarning``) and hands back the same objects as
``pagesift.client``; 0.1.0's path, kept as the one module of
``pagesift.shared``; the next minor version removes it (CHANGELOG.md).
"""

import warnings

from pagesift.client import *  # noqa: F403
from pagesift.client import __all__ as __all__

warnings.warn(
    "pagesift.shared.client is deprecated; import from pagesift.client",
    DeprecationWarning,
    stacklevel=2,
)
