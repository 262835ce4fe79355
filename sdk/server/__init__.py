"""`parley serve`: OpenAI- and Anthropic-compatible HTTP server over the local engine."""

__all__: list[str] = []
