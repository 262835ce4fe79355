"""API keys -> tenants, and the prefix-cache salt derived from them.

The prefix cache is shared by every request whose first block hashes the same, so a tenant who can
time cache hits can learn another tenant's prompts (Gu et al., ICML 2025). The salt is therefore
derived on the server from the authenticated tenant; a client's `cache_salt` (vLLM's field) only
narrows sharing further inside its own tenant and can never name another tenant's cache. Parts are
length-prefixed before hashing so ("org_1", "2345") and ("org_12345", "") differ.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from parley.server.errors import ApiError, ErrorKind

ANONYMOUS = "anonymous"
"""The tenant of every request when the server runs without API keys."""


def cache_salt(tenant: str, client_salt: str | None = None) -> str:
    """The engine's tenant salt for (server-side tenant, optional client salt): a length-prefixed SHA-256."""
    digest = hashlib.sha256()
    for part in (tenant, client_salt or ""):
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    digest.update(b"\x01" if client_salt is not None else b"\x00")
    return digest.hexdigest()


@dataclass(frozen=True)
class TenantRegistry:
    """Which API key belongs to which tenant. With no keys configured, every caller is `anonymous`."""

    keys: Mapping[str, str] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        """True when no key is configured: the server accepts any caller (bind it to 127.0.0.1)."""
        return not self.keys

    def tenant_for(self, api_key: str | None) -> str:
        """The tenant of a presented key, or a 401 in the caller's dialect."""
        if self.open:
            return ANONYMOUS
        if not api_key:
            raise ApiError(
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                kind=ErrorKind.AUTHENTICATION,
                code="invalid_api_key",
            )
        for known, tenant in self.keys.items():  # constant-time compare per key: no timing of key prefixes
            if hmac.compare_digest(known.encode("utf-8"), api_key.encode("utf-8")):
                return tenant
        raise ApiError("invalid API key", kind=ErrorKind.AUTHENTICATION, code="invalid_api_key")

    @classmethod
    def from_flags(cls, flags: Iterable[str]) -> TenantRegistry:
        """`KEY` (its own tenant, named by a hash of the key) or `KEY=TENANT` per flag."""
        keys: dict[str, str] = {}
        for flag in flags:
            key, sep, tenant = flag.partition("=")
            key = key.strip()
            if not key:
                raise ValueError(f"empty API key in {flag!r}")
            keys[key] = (
                tenant.strip() if sep and tenant.strip() else "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
            )
        return cls(keys)

    @classmethod
    def from_file(cls, path: str | Path) -> TenantRegistry:
        """A JSON object `{"<api key>": "<tenant>", ...}` or lines of `KEY=TENANT` (`#` comments)."""
        text = Path(path).read_text(encoding="utf-8")
        stripped = text.strip()
        if stripped.startswith("{"):
            data = json.loads(stripped)
            if not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in data.items()):
                raise ValueError(f"{path}: every key and tenant must be a non-empty string")
            return cls(dict(data))
        lines = [line.strip() for line in text.splitlines()]
        return cls.from_flags(line for line in lines if line and not line.startswith("#"))

    def merged(self, other: TenantRegistry) -> TenantRegistry:
        return TenantRegistry({**self.keys, **other.keys})


def api_key_from_headers(headers: Mapping[str, str]) -> str | None:
    """The key a client presented: OpenAI's bearer token or Anthropic's `x-api-key`."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None
