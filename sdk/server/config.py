"""`ServerConfig`: everything `parley serve` can be told, with safe defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.server.tenants import TenantRegistry


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How the HTTP layer behaves; the engine is configured separately (`EngineConfig`).

    - `model_name`: the id `GET /v1/models` lists; requests naming another model get a 404.
      `accept_any_model=True` serves every name with the one loaded model (handy for clients with a
      hard-coded model string).
    - `max_body_bytes`: larger bodies are refused with 413 before they are parsed.
    - `max_concurrent`: requests the server holds at once (queued in the engine or streaming); beyond
      it new work is refused with 429 and `retry-after` rather than queued without bound.
    - `default_max_tokens`: the OpenAI endpoint's limit when the client sends none (OpenAI's own
      default is "up to the context"; a CPU server wants a bound).
    - `max_deadline_s`: a client deadline is capped at this.
    """

    model_name: str = "smollm2-135m-instruct"
    accept_any_model: bool = False
    tenants: TenantRegistry = field(default_factory=TenantRegistry)
    max_body_bytes: int = 4 * 1024 * 1024
    max_concurrent: int = 256
    default_max_tokens: int = 1024
    max_deadline_s: float = 3600.0
    constrain_auto_tool_calls: bool = True
    """With `tool_choice: auto`, enforce each tool's schema once the model opens a `<tool_call>` (vLLM only
    does this for strict tools; a small model needs it for every call)."""
    retry_after_s: float = 1.0
    """The `retry-after` sent when the server is at `max_concurrent` and the engine gives no better hint."""
