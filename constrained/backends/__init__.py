"""Grammar backends behind one seam (`base.GrammarBackend`): llguidance, xgrammar and outlines-core.

Nothing here imports a grammar library at import time; each backend imports its own when used.
"""
