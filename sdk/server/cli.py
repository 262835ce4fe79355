"""`parley serve`: the command-line entry (wired into `parley.cli` by `add_serve_command`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from parley._engine_flags import add_engine_flags, engine_config
from parley.server.config import ServerConfig
from parley.server.tenants import TenantRegistry


def add_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the `parley` CLI's subparsers; the handler is `serve_main`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve the local engine over OpenAI- and Anthropic-compatible HTTP APIs"
    )
    parser.add_argument("--model", default=None, help="model folder or .gguf file (default: the embedded SmolLM2)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY[=TENANT]",
        help="accept this API key (repeatable); KEY=TENANT names its tenant. Without keys any caller is served.",
    )
    parser.add_argument("--api-keys-file", default=None, help='JSON {"key": "tenant"} or lines of KEY=TENANT')
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        metavar="NAME[,ALIAS...]",
        help="the id /v1/models lists (default: the model's own name, e.g. SmolLM2-135M-Instruct); repeatable "
        "or comma-separated: the first is listed, the others are aliases requests may name",
    )
    parser.add_argument("--accept-any-model", action="store_true", help="serve any requested model name")
    parser.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--max-concurrent", type=int, default=256, help="requests held at once before 429")
    parser.add_argument("--max-waiting", type=int, default=None, help="engine admission queue bound")
    parser.add_argument(
        "--responses-store", default=None, metavar="PATH",
        help="SQLite file keeping /v1/responses results per tenant (store, previous_response_id); default: none",
    )
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    add_engine_flags(parser)
    parser.add_argument("--log-level", default="info")
    parser.set_defaults(func=serve_main)
    return parser


def build_config(args: argparse.Namespace, model_name: str) -> ServerConfig:
    """The server's config from the parsed flags; `model_name` is the engine's own (used without a flag)."""
    tenants = TenantRegistry.from_flags(args.api_key)
    if args.api_keys_file:
        tenants = TenantRegistry.from_file(args.api_keys_file).merged(tenants)
    names = served_names(args.served_model_name)
    return ServerConfig(
        model_name=names[0] if names else model_name,
        model_aliases=tuple(names[1:]),
        accept_any_model=args.accept_any_model,
        tenants=tenants,
        max_body_bytes=args.max_body_bytes,
        max_concurrent=args.max_concurrent,
        responses_store=args.responses_store,
    )


def served_names(flags: list[str] | str | None) -> list[str]:
    """``--served-model-name`` values (repeated, comma-separated or both) as names, in order, without repeats."""
    values = [flags] if isinstance(flags, str) else list(flags or ())
    names: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def serve_main(args: argparse.Namespace) -> int:
    """Load the engine and serve until interrupted. Returns the process exit code."""
    import uvicorn

    from parley.local_engine import Engine
    from parley.server.app import create_app

    extra = {"max_waiting": args.max_waiting} if args.max_waiting is not None else {}
    engine = Engine.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                    config=engine_config(args, **extra))
    try:
        config = build_config(args, engine.model_name)
        if config.tenants.open and args.host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"warning: serving on {args.host} without API keys: anyone who can reach it may use it "
                "(pass --api-key KEY=TENANT)",
                file=sys.stderr,
            )
        app = create_app(engine, config=config)
        print(
            f"parley serve: {config.model_name} on http://{args.host}:{args.port}  (OpenAI /v1/chat/completions, "
            f"Anthropic /v1/messages, /metrics); tenants: {len(config.tenants.keys) or 'open (no API keys)'}"
        )
        print(f"  engine: {engine.mode} ({engine.mode_reason})")
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="off")
    finally:
        engine.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m parley.server.cli [serve options]`: the same command without the `parley` wrapper."""
    parser = argparse.ArgumentParser(prog="parley-serve", description=__doc__)
    subparsers = parser.add_subparsers(dest="command")
    add_serve_command(subparsers)
    args = parser.parse_args(["serve", *(argv if argv is not None else sys.argv[1:])])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
