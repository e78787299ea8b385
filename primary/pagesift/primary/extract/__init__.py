"""Extraction: untrusted bytes (HTML, PDF, office files) into document fields, in workers.

Nothing here does I/O; the engine runs ``html.extract_compact`` and
``documents.convert_compact`` in extraction worker processes (``engine.workers``, which
pickles them by module path) under a deadline and a memory cap. Imports flow down:

- ``html``: one parse per page -> ``Extracted``, and ``apply`` into a ``Document``;
  it reads through the four below:
- ``htmlshape``: depth and element caps, checked before parsing;
- ``htmlhead``: title, canonical, robots, metadata;
- ``htmllinks``: links with their anchor texts, images;
- ``htmlclean``: the content root, controls, cleaning, markdown;
- ``selectors``: a selector schema read over the page's parse (FORMAT_SELECTORS);
- ``metadata``: the bounds of ``Document.metadata`` (both paths), response headers;
- ``documents``: recognising a document (``kind_of``) and dispatching it to its reader:
- ``pdf``, ``ooxml``, ``odf``, ``epub``: one reader per format (PDF; DOCX, PPTX and
  XLSX; ODT; EPUB);
- ``zipguard``: the zip formats' member and size caps; ``xmlparts``: their hardened,
  streamed XML parse;
- ``converted``: the types every reader returns and raises, and their character budget.
"""
