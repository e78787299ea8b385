"""Mechanisms with no pagesift domain in them, used by every other subpackage."""
