"""The `parley` command line: demo, chat, bench, serve (registered by `parley.server.cli`) and mcp serve
(registered by `parley.mcp.cli`: parley tools offered to MCP clients over stdio or Streamable HTTP).

``parley demo`` is the main job in one command: the embedded SmolLM2-135M on CPU, no network. An
agent with two tools — a lookup over a small built-in table (its argument constrained to the
table's keys) and a side-effecting ``send_report`` that needs approval — runs until the approval
pauses it, writes the `RunState` to a file, approves the call *from the file*, resumes, and prints
a pydantic-typed final answer and the usage ledger, where turns 2+ read their prompt prefix from
the engine's prefix cache.

``parley chat`` is an interactive streaming REPL on the local backend.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

City = Literal["Oslo", "Lima", "Tokyo", "Cairo"]
WEATHER: dict[str, dict[str, Any]] = {
    "Oslo": {"temp_c": 4, "conditions": "light snow"},
    "Lima": {"temp_c": 19, "conditions": "overcast"},
    "Tokyo": {"temp_c": 12, "conditions": "clear"},
    "Cairo": {"temp_c": 27, "conditions": "sunny"},
}
DEMO_PROMPT = "What is the weather in Oslo? Look it up, send a short report to ops@example.com, then answer."


class WeatherReport(BaseModel):
    """The demo's typed final answer."""

    city: City
    temp_c: int
    conditions: Annotated[str, Field(max_length=40)]
    report_sent: bool


def _local_backend(args: argparse.Namespace, model: str | None = None) -> Any:
    """The local backend the engine flags ask for (`parley._engine_flags`)."""
    from parley._engine_flags import engine_config
    from parley.backends.local import LocalBackend

    return LocalBackend(model, engine_config=engine_config(args))


def _demo_agent(outbox: Path, *, max_tokens: int, backend: Any = None) -> Any:
    from parley import Agent, Message, tool
    from parley.backends import NamedToolChoice, SamplingSettings, ToolChoice
    from parley.backends.local import LocalBackend

    @tool
    def lookup_weather(city: City) -> dict[str, Any]:
        """Current weather for a city from the built-in table.

        Args:
            city: One of the cities the table knows.
        """
        return {"city": city, **WEATHER[city]}

    @tool(needs_approval=True)
    def send_report(
        to: Literal["ops@example.com", "team@example.com"], summary: Annotated[str, Field(max_length=40)]
    ) -> str:
        """Email a short weather report (a side effect: a human approves it first).

        Args:
            to: Recipient.
            summary: One-line report.
        """
        with open(outbox, "a", encoding="utf-8") as handle:
            handle.write(f"to={to} summary={summary}\n")
        return f"report sent to {to}"

    def plan(messages: list[Message]) -> ToolChoice:
        """A 135M model needs a plan: look up, then report, then answer (arguments are the model's)."""
        done = {result.name for message in messages for result in message.tool_results}
        if "lookup_weather" not in done:
            return NamedToolChoice("lookup_weather")
        if "send_report" not in done:
            return NamedToolChoice("send_report")
        return "none"

    return Agent(
        backend if backend is not None else LocalBackend(),
        instructions="You are a weather assistant. Use the tools, then answer in JSON.",
        tools=[lookup_weather, send_report],
        output_type=WeatherReport,
        tool_choice=plan,
        sampling=SamplingSettings(max_tokens=max_tokens),
        max_turns=6,
        name="weather-demo",
    )


async def _demo_async(args: argparse.Namespace) -> int:
    from parley import RunResult, RunState
    from parley.protocol import MessageEnd, Role, ToolCallEnd

    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="parley-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    state_path, outbox = workdir / "state.json", workdir / "outbox.txt"
    started = time.perf_counter()
    print("parley demo: embedded SmolLM2-135M-Instruct on CPU, no network")
    backend = _local_backend(args)
    agent = _demo_agent(outbox, max_tokens=args.max_tokens, backend=backend)
    print(f"  model loaded: {agent.backend.name}, {backend.engine.mode} ({time.perf_counter() - started:.1f} s)")
    print(f"  user: {DEMO_PROMPT}")

    async def run(stream: Any) -> RunResult[Any]:
        result: RunResult[Any] | None = None
        async for item in stream:
            if isinstance(item, ToolCallEnd):
                print(f"  model calls {item.call.name}({item.call.arguments})  [id {item.call.id}]")
            elif isinstance(item, MessageEnd) and item.message.role is Role.TOOL:
                for tool_result in item.message.tool_results:
                    print(f"  tool {tool_result.name} -> {tool_result.content}")
            elif isinstance(item, RunResult):
                result = item
        assert result is not None
        return result

    result = await run(agent.run_stream(DEMO_PROMPT, tenant="demo"))
    if not result.paused:
        print("  the run finished without pausing (unexpected for this demo)")
        return 1
    for item in result.interruptions:
        print(f"  PAUSED: {item.tool_name}({item.arguments}) needs {item.kind}  [id {item.call_id}]")
    result.state.save(state_path)
    print(
        f"  state written to {state_path} (schema_version {result.state.schema_version}, "
        f"{state_path.stat().st_size} bytes)"
    )

    state = RunState.load(state_path)  # a human (or another process) decides from the file
    for item in state.pending:
        state.approve(item.call_id)
        print(f"  approved {item.call_id} from the state file")
    state.save(state_path)

    final = await run(agent.run_stream(state=RunState.load(state_path)))
    print(f"  outbox: {outbox.read_text(encoding='utf-8').strip() if outbox.exists() else '(empty)'}")
    print(f"  final answer ({type(final.output).__name__}): {final.output!r}")
    _print_ledger(final.usage)
    print(f"  done in {time.perf_counter() - started:.1f} s")
    return 0


def _print_ledger(usage: Any) -> None:
    print("  usage ledger (per model turn):")
    print(f"    {'turn':>4} {'prompt':>7} {'cached':>7} {'uncached':>9} {'output':>7}")
    for turn, raw in enumerate(usage.raw, 1):
        prompt, cached = raw.get("prompt_tokens", 0), raw.get("cached_tokens", 0)
        print(f"    {turn:>4} {prompt:>7} {cached:>7} {prompt - cached:>9} {raw.get('output_tokens', 0):>7}")
    print(
        f"    {'all':>4} {usage.prompt_tokens:>7} {_or_unknown(usage.cache_read_tokens):>7} {usage.input_tokens:>9} "
        f"{usage.output_tokens:>7}   requests={usage.requests}"
    )


def _or_unknown(count: int | None) -> str:
    return "?" if count is None else str(count)


def _demo(args: argparse.Namespace) -> int:
    return asyncio.run(_demo_async(args))


async def _chat_async(args: argparse.Namespace) -> int:
    from parley import Agent, Message, Reasoning, RunResult
    from parley.backends import SamplingSettings
    from parley.protocol import ReasoningDelta, TextDelta

    reasoning = Reasoning(budget_tokens=args.think) if args.think is not None else None
    agent: Agent[str] = Agent(
        _local_backend(args, args.model),
        instructions=args.system,
        reasoning=reasoning,
        sampling=SamplingSettings(max_tokens=args.max_tokens, temperature=args.temperature),
    )
    history: list[Message] = []
    print("parley chat: local model, streaming. Empty line or Ctrl-D to quit.")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if not line:
            return 0
        print("bot> ", end="", flush=True)
        result: RunResult[str] | None = None
        async for item in agent.run_stream([*history, Message.user(line)]):
            if isinstance(item, TextDelta):
                print(item.text, end="", flush=True)
            elif isinstance(item, ReasoningDelta) and args.show_reasoning:
                print(f"\x1b[2m{item.text}\x1b[0m", end="", flush=True)
            elif isinstance(item, RunResult):
                result = item
        print()
        if result is not None:
            history = [m for m in result.messages if m.role.value != "system"]


def _chat(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_chat_async(args))
    except KeyboardInterrupt:
        print()
        return 0


def _bench(args: argparse.Namespace) -> int:
    """The engine's own figures on this machine and model, per mode (local_engine/bench.py), like llama-bench."""
    import json

    from tqdm.auto import tqdm

    from parley.local_engine import bench

    chosen = args.modes if args.modes is not None else ("auto,fp32" if args.quantization == "auto" else
                                                        "fp32" if args.quantization == "none" else args.quantization)
    modes = [m.strip() for m in chosen.split(",") if m.strip()]
    unknown = [m for m in modes if m not in bench.MODES]
    if unknown or not modes:
        print(f"parley bench: unknown mode {unknown[0] if unknown else args.modes!r}; "
              f"choose from {', '.join(bench.MODES)}", file=sys.stderr)
        return 2
    steps = len(modes) * (5 + (0 if args.no_spec else 1))
    with tqdm(total=steps, desc="parley bench", file=sys.stderr, disable=args.json and not sys.stderr.isatty()) as bar:

        def progress(what: str) -> None:
            bar.set_postfix_str(what)
            bar.update(1)

        result = bench.run(args.model, modes=modes, threads=args.threads, runs=args.runs,
                           decode_tokens=args.tokens, prefill_tokens=args.prefill, batch=args.batch,
                           speculation=not args.no_spec, compile=args.compile,
                           engine_speculation=None if args.speculation == "auto" else args.speculation,
                           progress=progress)
    print(json.dumps(result) if args.json else bench.table(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from parley._engine_flags import add_engine_flags

    parser = argparse.ArgumentParser(prog="parley", description="parley: agents over local and hosted models")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="approval pause, durable state, resume, typed answer (embedded model)")
    demo.add_argument("--dir", help="where to write state.json and outbox.txt (default: a new temp folder)")
    demo.add_argument("--max-tokens", type=int, default=64, help="per model turn")
    add_engine_flags(demo)
    demo.set_defaults(func=_demo)

    chat = sub.add_parser("chat", help="interactive streaming chat with the local model")
    chat.add_argument("--model", default=None, help="a .gguf file or HF folder (default: embedded SmolLM2)")
    chat.add_argument("--system", default=None, help="instructions")
    chat.add_argument("--think", type=int, default=None, metavar="N", help="reason first, at most N tokens")
    chat.add_argument("--show-reasoning", action="store_true")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float, default=0.0)
    add_engine_flags(chat)
    chat.set_defaults(func=_chat)

    bench_cmd = sub.add_parser("bench", help="the local engine's speed on this machine: decode, prefill, batching, "
                                             "cached-prefix TTFT, speculative decoding, per mode")
    bench_cmd.add_argument("--model", default=None, help="a .gguf file or HF folder (default: embedded SmolLM2)")
    bench_cmd.add_argument("--modes", default=None, help="comma-separated: auto (the default every engine runs), "
                           "fp32, bf16, int8, int8-head, q4, q4-head, q8, q8-head (default: auto,fp32, or the "
                           "--quantization mode)")
    bench_cmd.add_argument("--runs", type=int, default=3, help="timed runs per figure (the median is shown)")
    bench_cmd.add_argument("--tokens", type=int, default=64, help="decode length")
    bench_cmd.add_argument("--prefill", type=int, default=512, help="prompt length of the prefill figures")
    bench_cmd.add_argument("--batch", type=int, default=16, help="concurrent requests of the batching figure")
    bench_cmd.add_argument("--no-spec", action="store_true", help="skip the speculative-decoding figures")
    bench_cmd.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    add_engine_flags(bench_cmd)
    bench_cmd.set_defaults(func=_bench)

    from parley.server.cli import add_serve_command

    add_serve_command(sub)

    from parley.mcp.cli import add_mcp_command

    add_mcp_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
