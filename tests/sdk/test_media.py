"""Media in the SDK: RunState JSON keeps images small (inline below the limit, else in a blob store
next to the state) with their hashes; the local backend refuses them before any engine request;
a tool's image reaches the conversation as an attachment of its result."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from parley import Agent, RunState, tool
from parley.backends import LocalBackend, ModelRequest, ScriptedBackend, ScriptedTurn
from parley.errors import MissingBlobError, UnsupportedPartError
from parley.local_engine.testing import FakeEngine
from parley.protocol import Conversation, DocumentPart, FolderBlobStore, ImagePart, Message, ToolCall, ToolResult
from parley.protocol.blobs import INLINE_LIMIT

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
BIG_PNG = PNG + bytes(INLINE_LIMIT)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _state(image: ImagePart) -> RunState:
    call = ToolCall(id="call_1", name="snap", arguments="{}")
    result = ToolResult(call_id="call_1", name="snap", content="done", attachments=[image])
    return RunState(trace_id="t-media", messages=[Message.user("look", image), Message.assistant(tool_calls=[call])],
                    batch=[call], records={"call_1": result})


def test_run_state_keeps_small_images_inline_with_their_hash() -> None:
    state = _state(ImagePart(data=PNG))
    text = state.to_json()
    data = json.loads(text)
    assert data["messages"][0]["parts"][1]["sha256"] == sha(PNG) and "data" in data["messages"][0]["parts"][1]
    again = RunState.from_json(text)
    assert again == state
    assert again.records["call_1"].attachments[0].sha256 == sha(PNG)


def test_run_state_puts_large_images_in_the_blob_store(tmp_path: Path) -> None:
    state = _state(ImagePart(data=BIG_PNG))
    store = FolderBlobStore(tmp_path / "blobs")
    text = state.to_json(blobs=store)
    assert len(text) < 5_000 and sha(BIG_PNG) in text and sha(BIG_PNG) in store
    assert RunState.from_json(text, blobs=store) == state
    with pytest.raises(MissingBlobError) as caught:
        RunState.from_json(text)
    assert caught.value.sha256 == sha(BIG_PNG) and sha(BIG_PNG) in str(caught.value)


def test_save_keeps_blobs_in_a_folder_next_to_the_state(tmp_path: Path) -> None:
    state = _state(ImagePart(data=BIG_PNG))
    path = tmp_path / "run.json"
    state.save(path)
    assert path.stat().st_size < 5_000
    assert (tmp_path / "run.json.blobs" / sha(BIG_PNG)[:2] / sha(BIG_PNG)).read_bytes() == BIG_PNG
    assert RunState.load(path) == state
    small = tmp_path / "small.json"
    _state(ImagePart(data=PNG)).save(small)
    assert not (tmp_path / "small.json.blobs").exists()  # made only when needed


@pytest.mark.parametrize("part", [ImagePart(data=PNG), ImagePart(url="https://x/y.png"), DocumentPart(data=b"%PDF-")])
async def test_local_backend_refuses_media_before_any_engine_request(part: ImagePart | DocumentPart) -> None:
    engine = FakeEngine()
    backend = LocalBackend(engine=engine)
    request = ModelRequest(conversation=Conversation(messages=[Message.system("s"), Message.user("what?", part)]))
    with pytest.raises(UnsupportedPartError) as caught:
        await backend.generate(request)
    assert caught.value.param == "messages[1].content[1]" and caught.value.kind == part.kind
    with pytest.raises(UnsupportedPartError):
        async for _ in backend.stream(request):
            pass
    assert engine.submissions == []


async def test_an_agent_on_the_local_backend_raises_the_typed_error_naming_the_part() -> None:
    engine = FakeEngine()
    agent = Agent(LocalBackend(engine=engine), instructions="Be brief.")
    with pytest.raises(UnsupportedPartError) as caught:
        await agent.run([Message.user("what is this?", ImagePart(data=PNG))])
    assert "content[1]" in str(caught.value) and "text only" in str(caught.value)
    assert engine.submissions == []


@tool
def snap() -> list[object]:
    """Take a screenshot."""
    return ["the screen:", ImagePart(data=PNG)]


async def test_a_tools_image_becomes_an_attachment_of_its_result_and_survives_the_state() -> None:
    backend = ScriptedBackend([ScriptedTurn(tool_calls=[ToolCall(id="c1", name="snap", arguments="{}")]), "A cat."])
    result = await Agent(backend, tools=[snap]).run("what is on screen?")
    [tool_result] = [r for m in result.messages for r in m.tool_results]
    assert tool_result.content == "the screen:" and tool_result.attachments == [ImagePart(data=PNG)]
    again = RunState.from_json(result.state.to_json())
    [kept] = [r for m in again.messages for r in m.tool_results]
    assert kept.attachments[0].sha256 == sha(PNG)


@pytest.mark.parametrize(("value", "text"), [
    (ImagePart(data=PNG), ""),
    (("a", ImagePart(data=PNG), "b"), "a\nb"),
    ([{"n": 1}, ImagePart(data=PNG)], '{"n":1}'),
])
def test_a_tools_return_value_is_split_into_text_and_attachments(value: object, text: str) -> None:
    from parley.tools.results import render_result, split_attachments

    rest, media = split_attachments(value)
    assert render_result(rest) == text and media == [ImagePart(data=PNG)]
    assert split_attachments(["no", "media"]) == (["no", "media"], [])
