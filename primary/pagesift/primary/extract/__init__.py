"""Extraction: untrusted bytes (HTML, PDF, office files) into document fields, in workers.

Nothing here does I/O; the engine runs ``html.extract_compact`` and
``documents.convert_compact`` in extraction worker processes (``engine.workers``, which
pickles them by module path) under a deadline and a memory cap. Imports flow down:

- ``html``: one parse per page -> ``Extracted``, and ``apply`` into a ``Document``;
  it reads through ``htmlshape`` (depth and element caps, before parsing),
  ``htmlhead`` (title, canonical, robots, metadata), ``htmllinks`` (links, images)
  and ``htmlclean`` (content root, controls, cleaning, markdown).
- ``metadata``: the bounds of ``Document.metadata`` (both paths), response headers.
- ``documents``: recognising a document (``kind_of``) and dispatching it to its
  reader: ``pdf``, ``ooxml`` (DOCX, PPTX, XLSX), ``odf`` (ODT), ``epub``; the zip
  formats read through ``zipguard`` (member and size caps) and ``xmlparts`` (the
  hardened XML parse); every reader returns and raises ``converted``'s types.
"""
