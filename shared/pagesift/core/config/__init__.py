"""Server configuration: the ``ServerConfig`` schema and the loader that fills it.

- ``schema``: every key with its default and meaning;
- ``settings``: the TOML file, ``PAGESIFT_*`` variables and flags read into it, and
  docs/configuration.md's table of every key (``config_table_markdown``);
- ``packagetable``: docs/architecture.md's table of every package, from the packages'
  docstrings (read, never imported).

``settings`` imports ``schema``, never the other way round.
"""
