"""Backends: local engine, hosted providers, scripted test doubles."""

__all__: list[str] = []
