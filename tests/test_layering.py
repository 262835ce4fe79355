"""Dependency direction is the architecture (DESIGN.md §1): low layers never import high ones."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folder -> the parley subpackages it may import. `parley._root` (the error root) is open to all.
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "sandbox": set(),
    "local_engine": set(),
    "constrained": {"protocol"},
    "tools": {"protocol", "constrained", "sandbox"},
}
LAYERS = {"protocol", "constrained", "sandbox", "tools", "local_engine"}


def _parley_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] != "parley":
                continue
            if len(parts) == 1 or parts[1] == "_root":
                if len(parts) == 1:
                    found.add("sdk")
                continue
            found.add(parts[1] if parts[1] in LAYERS else "sdk")
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_layer_imports_only_what_design_allows(folder: str) -> None:
    offenders: list[str] = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = _parley_imports(path) - ALLOWED[folder] - {folder}
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, "layering violated:\n" + "\n".join(offenders)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("from parley.tools import tool\nimport parley.local_engine.engine\nfrom parley import Agent\n")
    assert _parley_imports(sample) == {"tools", "local_engine", "sdk"}
