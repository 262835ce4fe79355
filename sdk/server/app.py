"""`create_app(engine)`: the Starlette application behind `parley serve`.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `POST /v1/responses`
with `GET`/`DELETE /v1/responses/{id}` (OpenAI), `POST /tokenize` and `/detokenize` (vLLM's),
`POST /v1/messages` and
`POST /v1/messages/count_tokens` (Anthropic),
`GET /health`, `GET /metrics` (Prometheus text). Unknown paths and wrong methods answer in
OpenAI's error shape (or Anthropic's under `/v1/messages`), never Starlette's plain text.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from parley.backends.local.codec import codec_for
from parley.backends.local.engine_port import EnginePort
from parley.backends.local.family import PromptFamily
from parley.server.anthropic_routes import count_tokens, messages
from parley.server.completions_routes import completions, detokenize, tokenize
from parley.server.config import ServerConfig
from parley.server.context import ServerState, error_response, state_of
from parley.server.errors import ApiError, Dialect, ErrorKind
from parley.server.metrics import Metrics
from parley.server.openai_routes import chat_completions, list_models
from parley.server.responses_routes import create_response, delete_response, get_response
from parley.server.responses_store import ResponseStore


async def health(request: Request) -> Response:
    state = state_of(request)
    try:
        stats = state.engine.stats()
    except Exception as exc:  # the engine is unwell: say so, with a 503 load balancers understand
        return JSONResponse({"status": "unhealthy", "error": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.config.model_name, "engine": _jsonable(stats)})


async def metrics(request: Request) -> Response:
    text = state_of(request).metrics.render()
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def _jsonable(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if isinstance(v, str | int | float | bool) or v is None}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    dialect: Dialect = "anthropic" if request.url.path.startswith("/v1/messages") else "openai"
    kind = {404: ErrorKind.NOT_FOUND, 413: ErrorKind.TOO_LARGE}.get(exc.status_code, ErrorKind.INVALID_REQUEST)
    message = {404: f"no route for {request.url.path}", 405: f"method {request.method} is not allowed here"}.get(
        exc.status_code, str(exc.detail)
    )
    return error_response(ApiError(message, kind=kind, status=exc.status_code), dialect)


def served_name_of(engine: EnginePort) -> str:
    """The name a server lists for `engine` by default: its `model_name`, else the name in its `model_id`."""
    name = getattr(engine, "model_name", None)
    if isinstance(name, str) and name:
        return name
    parts = [p for p in engine.model_id.split("@", 1)[0].replace("\\", "/").split("/") if p]
    if len(parts) > 1 and parts[-1] in ("float32", "bfloat16", "float16"):
        parts.pop()  # a dtype suffix (the engine's cache identity) is no name
    return parts[-1] if parts else "local"


def create_app(
    engine: EnginePort,
    *,
    config: ServerConfig | None = None,
    codec: PromptFamily | None = None,
) -> Starlette:
    """The ASGI app serving `engine`. `codec` defaults to the prompt family `codec_for` picks for its tokenizer.

    The listed model id is `config.model_name`, else the engine's own `model_name`.
    """
    config = config or ServerConfig()
    if not config.model_name:
        config = replace(config, model_name=served_name_of(engine))
    prompts: PromptFamily = codec if codec is not None else codec_for(engine.tokenizer)
    state = ServerState(
        engine=engine,
        codec=prompts,
        config=config,
        metrics=Metrics(engine.stats),
    )
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.parley = state
    app.state.parley_responses = ResponseStore(config.responses_store) if config.responses_store else None
    return app
