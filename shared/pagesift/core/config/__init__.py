"""Server configuration: the ``ServerConfig`` schema and the loader that fills it.

``schema`` declares every key with its default and meaning; ``settings`` reads the TOML
file, ``PAGESIFT_*`` variables and flags into it. ``settings`` imports ``schema``, never the
other way round. The two generated tables of the docs are built here: docs/configuration.md's
keys (``settings.config_table_markdown``) and docs/architecture.md's packages
(``packagetable``, from the packages' docstrings, read and never imported).
"""
