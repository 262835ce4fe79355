"""Model-facing error text: short, printable, and free of host details and secrets.

A tool's exception message goes back to the model (and from there possibly to a user or an attacker
who injected the prompt). `safe_error_text` keeps the useful part — the exception type and what went
wrong — and removes: ANSI/control characters, credentials in URLs (`https://user:pw@host`), bearer
tokens and API-key-shaped strings, values of secret-looking environment variables, and absolute
filesystem paths (reduced to their last component). The text is capped (default 500 characters).
"""

from __future__ import annotations

import os
import re

DEFAULT_MAX_CHARS = 500

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+(?::[^/\s@]*)?@")
_BEARER = re.compile(
    r"(?i)\b(bearer)(\s+)(\S+)|\b(\w*(?:token|api[_-]?key|secret|password|passwd|pwd))(\s*[:=]\s*)(\S+)"
)
_KEY_SHAPED = re.compile(r"\b(sk|pk|rk|ghp|gho|ghs|xox[abp]|AKIA)[-_A-Za-z0-9]{12,}\b")
_ABS_PATH = re.compile(r"(?<![\w.~:/])(?:/[\w.@+-]+){2,}/?")
_SECRET_ENV_NAME = re.compile(r"(?i)(key|token|secret|passw|credential|auth)")


def _secret_env_values() -> list[str]:
    values = [v for k, v in os.environ.items() if _SECRET_ENV_NAME.search(k) and len(v) >= 6]
    return sorted(values, key=len, reverse=True)


def _redact_assignment(match: re.Match[str]) -> str:
    if match.group(1) is not None:
        return f"{match.group(1)}{match.group(2)}<redacted>"
    return f"{match.group(4)}{match.group(5)}<redacted>"


def _last_component(match: re.Match[str]) -> str:
    path = match.group(0).rstrip("/")
    return "<path>/" + path.rsplit("/", 1)[-1]


def safe_text(text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """Sanitise arbitrary text for a model (see the module docstring)."""
    text = _ANSI.sub("", text)
    text = _CONTROL.sub(" ", text)
    for value in _secret_env_values():
        text = text.replace(value, "<redacted>")
    text = _URL_USERINFO.sub(r"\1<redacted>@", text)
    text = _BEARER.sub(_redact_assignment, text)
    text = _KEY_SHAPED.sub("<redacted>", text)
    text = _ABS_PATH.sub(_last_component, text)
    text = text.strip()
    if len(text) > max_chars:
        text = text[: max_chars - 1].rstrip() + "…"
    return text


def safe_error_text(error: BaseException, *, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """`"<ExceptionType>: <sanitised message>"` — never a traceback, a host path or a secret."""
    kind = type(error).__name__
    try:
        message = str(error)
    except Exception:  # a hostile __str__
        message = ""
    message = safe_text(message, max_chars=max_chars)
    return f"{kind}: {message}" if message else kind
