"""Grammar backends behind one seam (`base.GrammarBackend`): xgrammar (default) and outlines-core.

Nothing here imports a grammar library at import time; each backend imports its own when used.
"""
