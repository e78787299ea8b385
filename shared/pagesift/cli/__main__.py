"""``python -m pagesift.cli``: the ``pagesift`` command (see ``pagesift.cli``)."""

import sys

from pagesift.cli import main

sys.exit(main())
