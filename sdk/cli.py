"""The `parley` command line: demo, chat, serve, bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from parley.protocol import Conversation, Message, ToolCall

    conversation = Conversation(
        messages=[
            Message.system("You are a helpful assistant."),
            Message.user("What is the weather in Tokyo?"),
            Message.assistant(tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Tokyo"}')]),
            Message.tool("call_1", "get_weather", '{"temp_c": 18}'),
            Message.assistant("It is 18 °C in Tokyo.", channel="final"),
        ]
    )
    text = conversation.to_json()
    print("conversation as JSON:")
    print(text)
    assert Conversation.from_json(text) == conversation
    print("round trip: identical")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parley", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded model")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
