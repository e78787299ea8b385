"""Server configuration: the ``ServerConfig`` schema and the loader that fills it.

``schema`` declares every key with its default and meaning; ``settings`` reads the TOML
file, ``PAGESIFT_*`` variables and flags into it. ``settings`` imports ``schema``, never the
other way round.
"""
