"""The error tree drawn in `parley.errors` is the whole tree: every ParleyError subclass is in it."""

from __future__ import annotations

import importlib
import pkgutil

import parley
import parley.errors
from parley.errors import ParleyError

SKIP_PREFIXES = ("parley.local_engine.models",)


def _import_everything() -> None:
    for module in pkgutil.walk_packages(parley.__path__, "parley."):
        if module.name.startswith(SKIP_PREFIXES) or module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found.add(sub)
        found |= _subclasses(sub)
    return found


def test_every_error_class_is_drawn_and_exported() -> None:
    _import_everything()
    doc = parley.errors.__doc__ or ""
    ours = {cls for cls in _subclasses(ParleyError) if cls.__module__.startswith("parley.")}
    undrawn = sorted(cls.__qualname__ for cls in ours if f" {cls.__name__} " not in doc.replace("\n", " \n "))
    assert not undrawn, f"add these to the tree in parley/errors.py's docstring: {undrawn}"
    unexported = sorted(cls.__name__ for cls in ours if cls.__name__ not in parley.errors.__all__)
    assert not unexported, f"export these from parley.errors: {unexported}"
    for cls in ours:
        assert getattr(parley.errors, cls.__name__) is cls, f"parley.errors.{cls.__name__} is another class"
