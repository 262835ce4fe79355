"""Harmony's own message model, one level below parley's envelope.

The envelope (`parley.protocol.envelope.Message`) is what the rest of parley speaks; these types are
what the Harmony wire format can say, field for field, so rendering and parsing can be checked
against the reference test vectors exactly. `parley.protocol.harmony` converts between the two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from parley.protocol.harmony._tokens import HarmonyEncoding, split_special
from parley.protocol.tool_spec import ToolSpec

ReasoningEffort = Literal["low", "medium", "high"]
HARMONY_ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")
DEFAULT_MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
DEFAULT_CHANNELS: tuple[str, ...] = ("analysis", "commentary", "final")


@dataclass(frozen=True)
class ToolNamespace:
    """A `## name` tools section: `functions` for the developer's tools, `browser`/`python` built-ins."""

    name: str
    description: str | None = None
    tools: tuple[ToolSpec, ...] = ()

    @classmethod
    def functions(cls, tools: Iterable[ToolSpec]) -> ToolNamespace:
        return cls(name="functions", tools=tuple(tools))


@dataclass(frozen=True)
class SystemContent:
    """What the Harmony system message says. Defaults are those of openai/harmony's `SystemContent.new()`.

    Sections are left out when their field is None (`reasoning_effort=None` drops `Reasoning: …`;
    `valid_channels=None` drops the channel line). `tools` holds built-in namespaces such as `browser`
    or `python`; the caller's function tools belong in the developer message.
    """

    kind: Literal["harmony_system"] = "harmony_system"
    model_identity: str | None = DEFAULT_MODEL_IDENTITY
    reasoning_effort: ReasoningEffort | None = "medium"
    current_date: str | None = None
    """The conversation start date, e.g. `2025-06-28` (rendered `Current date: …`)."""
    knowledge_cutoff: str | None = "2024-06"
    valid_channels: tuple[str, ...] | None = DEFAULT_CHANNELS
    channel_required: bool = True
    tools: tuple[ToolNamespace, ...] = ()


@dataclass(frozen=True)
class DeveloperContent:
    """The developer message: `# Instructions` and the tools sections (function tools live here)."""

    kind: Literal["harmony_developer"] = "harmony_developer"
    instructions: str | None = None
    tools: tuple[ToolNamespace, ...] = ()

    @property
    def has_function_tools(self) -> bool:
        return any(ns.name == "functions" and ns.tools for ns in self.tools)


Content = str | SystemContent | DeveloperContent


@dataclass(frozen=True)
class HarmonyMessage:
    """One Harmony message: `<|start|>{header}<|message|>{content}<|end|>`.

    `name` is the author name; for role `tool` it is the tool (`functions.get_weather`) and the header
    shows it in place of the role. `content_type` is kept verbatim, e.g. `"<|constrain|>json"`,
    `"json"` or `"code"`; a leading `<|constrain|>` is rendered as the special token.
    """

    role: str
    content: Content = ""
    name: str | None = None
    recipient: str | None = None
    channel: str | None = None
    content_type: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else ""


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt as `(text, is_special)` pieces.

    The pieces are the trust boundary: only formatting tokens the renderer wrote are special; every
    piece of content (user text, tool output, even a model's earlier reply) is ordinary text, so
    `token_ids()` encodes a `<|start|>` written by a user as plain characters. `text` joins the pieces
    for display and text-level comparison; it cannot say which `<|…|>` was a token, so never
    tokenize `text` with special tokens allowed — use `token_ids()`.
    """

    pieces: tuple[tuple[str, bool], ...] = field(default_factory=tuple)

    @property
    def text(self) -> str:
        return "".join(piece for piece, _ in self.pieces)

    def __str__(self) -> str:
        return self.text

    def token_ids(self, encoding: HarmonyEncoding) -> list[int]:
        return encoding.encode_pieces(self.pieces)

    @property
    def text_is_unambiguous(self) -> bool:
        """False when some content piece contains a special-token string (its text form is then lossy)."""
        return not any(not special and any(s for _, s in split_special(piece)) for piece, special in self.pieces)

    def __add__(self, other: RenderedPrompt) -> RenderedPrompt:
        return RenderedPrompt(self.pieces + other.pieces)
