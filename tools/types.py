"""Argument types for tools that touch the host: validated at the schema, before the tool runs.

A string is only data until a tool turns it into a path or an argv element; these types make that
step safe by construction, so a tool author writes `path: RelativePath` instead of re-deriving the
rules (reference/sandbox.md, battery G2-G6):

* `RelativePath` — a relative path that cannot leave its root: printable ASCII from a small set
  (no NUL, backslash, `%`-escapes, fullwidth dots, RTL overrides or other NFKC look-alikes), no
  absolute or `~` prefix, no `..` or empty components, no component starting with `-` (so it can
  never be read as a command-line option). Resolve it against a root with `openat2(RESOLVE_BENEATH)`
  (or the sandbox's file API) anyway: symlinks inside the root are the filesystem's business.
* `CommandArgument` — one argv element for a command run without a shell: not starting with `-`,
  no NUL or control characters. (Shell metacharacters are harmless without a shell and allowed.)
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_PATH_CHARS = 1024
_PATH_CHARS = r"[A-Za-z0-9_.+=@, /-]"
_PATH_PATTERN = rf"^[A-Za-z0-9_.+=@,]{_PATH_CHARS}*$"
_PATH = re.compile(_PATH_PATTERN)


def check_relative_path(value: str) -> str:
    """Return `value` if it is a safe relative path (see the module docstring), else raise `ValueError`."""
    if not _PATH.match(value):
        raise ValueError(
            "path must be relative and use only letters, digits, spaces and . _ - + = @ , /"
            " (no leading '/', '-', '~' or space)"
        )
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts[:-1]) or parts[-1] in (".", ".."):
        raise ValueError("path must not contain '.', '..' or empty components")
    if any(part.startswith("-") or part != part.strip() for part in parts):
        raise ValueError("path components must not start with '-' or start/end with a space")
    return value


def check_command_argument(value: str) -> str:
    """Return `value` if it is a safe argv element (see the module docstring), else raise `ValueError`."""
    if not value or value.startswith("-"):
        raise ValueError("argument must be non-empty and must not start with '-'")
    if any(not ch.isprintable() for ch in value):
        raise ValueError("argument must not contain control characters")
    return value


RelativePath = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PATH_CHARS, pattern=_PATH_PATTERN),
    AfterValidator(check_relative_path),
]
"""A relative path that cannot escape its root (validated; the pattern is also in the JSON Schema)."""

CommandArgument = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(check_command_argument)]
"""One argv element for a shell-less command: never an option, never a control character."""
