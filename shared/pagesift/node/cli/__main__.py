"""``python -m pagesift.node.cli``: the ``pagesift`` command (see ``pagesift.node.cli``)."""

import sys

from pagesift.node.cli import main

sys.exit(main())
