"""The wheel contains every package: an unlisted subpackage would be silently dropped."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["setuptools"]


def test_every_folder_with_init_is_a_listed_package() -> None:
    config = _config()
    listed = set(config["packages"])
    discovered: set[str] = set()
    for dotted, folder in config["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            name = ".".join([dotted, *rel.parts]) if rel.parts else dotted
            # a mapped subfolder (sdk has none of the layer folders inside it) is its own entry
            discovered.add(name)
    missing = sorted(discovered - listed)
    assert not missing, f"packages missing from pyproject [tool.setuptools] packages: {missing}"


def test_every_listed_package_exists() -> None:
    config = _config()
    dirs = config["package-dir"]
    for name in config["packages"]:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in dirs:
                folder = ROOT / dirs[prefix] / Path(*parts[i:])
                break
        assert (folder / "__init__.py").is_file(), f"{name} is listed but {folder} has no __init__.py"


def test_each_package_ships_py_typed() -> None:
    for folder in _config()["package-dir"].values():
        assert (ROOT / folder / "py.typed").is_file(), f"{folder}/py.typed is missing"
