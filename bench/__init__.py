"""pagesift benchmarks: ``python -m bench.run`` (or ``make bench``) runs every section.

Each section lives in its own module (``bench.crawl``, ``bench.replication``, ...) and
writes its figures to ``bench/out/``. Shared helpers are in ``bench.common``.
"""
