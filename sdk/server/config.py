"""`ServerConfig`: everything `parley serve` can be told, with safe defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from parley.server.tenants import TenantRegistry


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How the HTTP layer behaves; the engine is configured separately (`EngineConfig`).

    - `model_name`: the id `GET /v1/models` lists; empty (the default) means the engine's own
      `model_name` (e.g. ``SmolLM2-135M-Instruct``). Requests naming another model get a 404, unless
      the name is one of `model_aliases` (or the engine's `model_id`).
      `accept_any_model=True` serves every name with the one loaded model (handy for clients with a
      hard-coded model string).
    - `max_body_bytes`: larger bodies are refused with 413 before they are parsed.
    - `max_concurrent`: requests the server holds at once (queued in the engine or streaming); beyond
      it new work is refused with 429 and `retry-after` rather than queued without bound.
    - `default_max_tokens`: the OpenAI endpoint's limit when the client sends none (OpenAI's own
      default is "up to the context"; a CPU server wants a bound).
    - `max_deadline_s`: a client deadline is capped at this.
    - `responses_store`: a SQLite file (or ``":memory:"``) keeping `/v1/responses` results for `store` and
      `previous_response_id`, per tenant; None (the default) keeps nothing.
    """

    model_name: str = ""
    model_aliases: tuple[str, ...] = ()
    accept_any_model: bool = False
    tenants: TenantRegistry = field(default_factory=TenantRegistry)
    max_body_bytes: int = 4 * 1024 * 1024
    max_concurrent: int = 256
    default_max_tokens: int = 1024
    max_deadline_s: float = 3600.0
    constrain_auto_tool_calls: bool = True
    """With `tool_choice: auto`, enforce each tool's schema once the model opens a `<tool_call>` (vLLM only
    does this for strict tools; a small model needs it for every call)."""
    responses_store: str | None = None
    retry_after_s: float = 1.0
    """The `retry-after` sent when the server is at `max_concurrent` and the engine gives no better hint."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_aliases", tuple(self.model_aliases))

    def serves(self, name: str) -> bool:
        """Whether a request naming `name` is for the served model (its id or an alias)."""
        return self.accept_any_model or name == self.model_name or name in self.model_aliases
