"""Docstring reading: a tool's description and its parameters' descriptions come from the docstring.

The model sees the function's own documentation, so the docstring is written once. Three common
styles are understood (the style is detected per docstring):

* Google — an `Args:` (or `Arguments:`, `Parameters:`, `Params:`) section with `name (type): text` lines;
* numpy — a `Parameters` heading underlined with dashes, then `name : type` and an indented text;
* reST/Sphinx — `:param name: text` (or `:param type name: text`) fields.

The description is everything before the first section or field, with paragraphs kept.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

_GOOGLE_PARAM_HEADERS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "kwargs"}
_GOOGLE_HEADERS = _GOOGLE_PARAM_HEADERS | {
    "returns", "return", "yields", "yield", "raises", "raise", "examples", "example", "note", "notes",
    "attributes", "see also", "warning", "warnings", "todo", "references",
}  # fmt: skip
_GOOGLE_HEADER = re.compile(r"^\s*([A-Za-z][A-Za-z ]*):\s*$")
_GOOGLE_ITEM = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_NUMPY_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ITEM = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*(?::\s*(.*))?$")
_REST_FIELD = re.compile(r"^\s*:([A-Za-z]+)((?:\s+[^:]+)?):\s*(.*)$")


@dataclass(frozen=True)
class Docstring:
    """What a docstring says: the description and one text per documented parameter."""

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)


def _join(lines: list[str]) -> str:
    """Join wrapped lines into paragraphs: single newlines become spaces, blank lines stay."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _parse_google(lines: list[str], start: int) -> tuple[dict[str, str], int]:
    """Parse a Google `Args:` block starting after its header; returns params and the next line index."""
    params: dict[str, str] = {}
    i = start
    base: int | None = None
    name: str | None = None
    text: list[str] = []
    while i < len(lines):
        line = lines[i]
        if line.strip():
            indent = _indent(line)
            if base is None:
                base = indent
            if indent < base or (indent == 0 and _GOOGLE_HEADER.match(line)):
                break
            match = _GOOGLE_ITEM.match(line.strip()) if indent == base else None
            if match:
                if name is not None:
                    params[name] = _join(text)
                name, text = match.group(1).lstrip("*"), [match.group(3)]
            elif name is not None:
                text.append(line)
        elif name is not None:
            text.append("")
        i += 1
    if name is not None:
        params[name] = _join(text)
    return params, i


def _parse_numpy(lines: list[str], start: int) -> tuple[dict[str, str], int]:
    """Parse a numpy `Parameters` block starting after its underline."""
    params: dict[str, str] = {}
    i = start
    names: list[str] = []
    text: list[str] = []
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and _NUMPY_UNDERLINE.match(lines[i + 1]) and line.strip():
            break  # the next section's heading
        if line.strip() and _indent(line) == 0:
            match = _NUMPY_ITEM.match(line.strip())
            if match:
                for n in names:
                    params[n] = _join(text)
                names = [n.strip().lstrip("*") for n in match.group(1).split(",")]
                text = []
        elif names:
            text.append(line)
        i += 1
    for n in names:
        params[n] = _join(text)
    return params, i


def parse_docstring(doc: str | None) -> Docstring:
    """Read the description and per-parameter texts out of `doc` (any of the three styles)."""
    if not doc:
        return Docstring()
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    in_description = True
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _GOOGLE_HEADER.match(line)
        if header and _indent(line) == 0 and header.group(1).strip().lower() in _GOOGLE_HEADERS:
            in_description = False
            if header.group(1).strip().lower() in _GOOGLE_PARAM_HEADERS:
                found, i = _parse_google(lines, i + 1)
                params.update(found)
                continue
            i += 1
            continue
        if line.strip() and i + 1 < len(lines) and _NUMPY_UNDERLINE.match(lines[i + 1]):
            in_description = False
            if line.strip().lower() in {"parameters", "other parameters", "keyword arguments"}:
                found, i = _parse_numpy(lines, i + 2)
                params.update(found)
                continue
            i += 2
            continue
        rest = _REST_FIELD.match(line)
        if rest:
            in_description = False
            kind, target, text = rest.group(1).lower(), rest.group(2).split(), [rest.group(3)]
            i += 1
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > 0 and not _REST_FIELD.match(lines[i]):
                text.append(lines[i])
                i += 1
            if kind in {"param", "parameter", "arg", "argument", "key", "keyword"} and target:
                params[target[-1].lstrip("*")] = _join(text)
            continue
        if in_description:
            description.append(line)
        i += 1
    return Docstring(description=_join(description), params=params)
