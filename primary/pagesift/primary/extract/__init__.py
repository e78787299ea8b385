"""Extraction: untrusted bytes (HTML, PDF, office files) into document fields, in workers."""
