"""Text a session cannot store, found before it costs anything.

A row is the message's JSON in UTF-8, and a lone surrogate (``"\\ud800"``: half of a UTF-16 pair,
which Python strings may hold, e.g. from ``surrogateescape`` decoding or a JSON escape) has no
UTF-8 form. Found only when the turn is written, it would fail the run after the model was called
and paid for; so a run with a session looks at each message when it joins the turn (the input,
each tool result, each repair prompt) and refuses it before the next model call, with the same
`UnencodableTextError` the local backend raises for text its tokenizer cannot encode, naming the
place (``messages[2].parts[0].content``: the index counts the run's own messages).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from parley.protocol import Message, Role
from parley.protocol.errors import UnencodableTextError


def first_unstorable(message: Message) -> tuple[str, int, int] | None:
    """Where `message` holds text without a UTF-8 form: (field path, character offset, code point)."""
    for path, text in _strings(message, ""):
        if text.isascii():
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as bad:
            return path.lstrip("."), bad.start, ord(text[bad.start])
    return None


def refuse_unstorable(messages: Sequence[Message], start: int = 0, *, prefix: str = "messages") -> int:
    """Raise `UnencodableTextError` for the first of ``messages[start:]`` a session cannot store;
    return ``len(messages)`` (where the next look starts)."""
    for index in range(start, len(messages)):
        message = messages[index]
        found = first_unstorable(message)
        if found is None:
            continue
        path, position, code = found
        where = f"{prefix}[{index}].{path}"
        raise UnencodableTextError(
            f"{_what(message)} cannot be stored in the session: {where} holds a lone surrogate U+{code:04X} at "
            f"character {position} (text must be valid Unicode: a surrogate is only half of a UTF-16 pair); "
            "nothing was sent to the model",
            where=where, position=position,
        )
    return len(messages)


def _what(message: Message) -> str:
    if message.role == Role.TOOL:
        results = message.tool_results
        if results:
            return f"the result of tool {results[0].name!r} (call {results[0].call_id!r})"
        return "a tool message"
    if message.role == Role.USER:
        return "the user input"
    return f"a {message.role.value} message"


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every str inside a model (fields, lists, dicts' keys and values), with its path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _strings(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield f"{path}.<key>", key
            yield from _strings(item, f"{path}[{key!r}]")
