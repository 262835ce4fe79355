"""Image and document parts: content hashing, JSON with and without a blob store, Anthropic and
OpenAI wire JSON both ways, and the typed refusal of text-only codecs (chat templates, Harmony)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from parley.protocol import (
    BlobIntegrityError,
    ChatTemplateCodec,
    Conversation,
    DocumentPart,
    FolderBlobStore,
    ImagePart,
    MemoryBlobStore,
    Message,
    MissingBlobError,
    ProtocolError,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
    UnsupportedPartError,
    harmony,
)
from parley.protocol import anthropic as anthropic_wire
from parley.protocol import openai as openai_wire
from parley.protocol.blobs import INLINE_LIMIT

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(64))
JPEG = b"\xff\xd8\xff\xe0" + bytes(100)
PDF = b"%PDF-1.7\n" + b"1 0 obj << >> endobj\n" * 8 + b"%%EOF"
BIG_PNG = PNG + bytes(INLINE_LIMIT)  # just over the inline limit


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _image_conversation(image: ImagePart) -> Conversation:
    call = ToolCall(id="call_1", name="screenshot", arguments="{}")
    return Conversation(messages=[
        Message.system("Look closely."),
        Message.user("What is in this picture?", image),
        Message.assistant(tool_calls=[call]),
        Message.tool("call_1", "screenshot", "the screen:", attachments=[ImagePart(data=JPEG)]),
    ])


# -- the parts ----------------------------------------------------------------------------------------
def test_bytes_are_hashed_and_the_media_type_read_from_the_signature() -> None:
    image = ImagePart(data=PNG)
    assert image.sha256 == sha(PNG) and image.media_type == "image/png" and image.size == len(PNG)
    assert ImagePart.from_bytes(JPEG).media_type == "image/jpeg"
    assert ImagePart(data=JPEG, media_type="image/jpg").media_type == "image/jpeg"
    assert DocumentPart(data=PDF, title="Q3").sha256 == sha(PDF)
    assert ImagePart(url="https://example.com/cat.png").sha256 is None


def test_a_data_url_becomes_bytes_and_base64_text_is_accepted() -> None:
    from_url = ImagePart(url="data:image/png;base64," + b64(PNG))
    assert from_url == ImagePart(data=PNG) and from_url.url is None
    assert ImagePart(data=b64(PNG)) == ImagePart(data=PNG)
    assert from_url.data_url() == "data:image/png;base64," + b64(PNG)


@pytest.mark.parametrize("fields", [
    {"data": b"not an image"},  # no media type, and none can be read from the bytes
    {"data": PNG, "media_type": "image/bmp"},
    {"data": PNG, "url": "https://x/y.png"},
    {},
    {"data": "@@not base64@@", "media_type": "image/png"},
    {"url": "https://x/y.png", "sha256": "0" * 64},
])
def test_malformed_parts_are_refused(fields: dict) -> None:
    with pytest.raises(ValidationError):
        ImagePart(**fields)


def test_a_hash_that_does_not_match_the_bytes_is_a_typed_error() -> None:
    with pytest.raises(BlobIntegrityError) as caught:
        ImagePart(data=PNG, sha256="0" * 64)
    assert caught.value.expected == "0" * 64 and caught.value.actual == sha(PNG)


def test_parts_are_frozen_so_the_hash_cannot_go_stale() -> None:
    image = ImagePart(data=PNG)
    with pytest.raises(ValidationError):
        image.data = JPEG  # type: ignore[misc]


def test_tool_result_content_may_hold_media_which_become_attachments() -> None:
    image, doc = ImagePart(data=PNG), DocumentPart(url="https://x/r.pdf")
    result = ToolResult(call_id="c", name="f", content=["the chart:", image, TextPart(text=" and"), doc])
    assert result.content == "the chart: and" and result.attachments == [image, doc]
    assert result.content_parts == [TextPart(text="the chart: and"), image, doc]
    with pytest.raises(ValidationError):
        ToolResult(call_id="c", name="f", content=[ToolCall(id="x", name="y")])


def test_results_without_attachments_serialise_as_before() -> None:
    plain = ToolResult(call_id="c", name="f", content="ok")
    assert json.loads(plain.model_dump_json()) == {"kind": "tool_result", "call_id": "c", "name": "f",
                                                   "content": "ok", "is_error": False}


# -- JSON, inline and in a blob store ------------------------------------------------------------------
def test_small_media_round_trip_inline_with_their_hash() -> None:
    conversation = _image_conversation(ImagePart(data=PNG))
    text = conversation.to_json()
    part = json.loads(text)["messages"][1]["parts"][1]
    assert part == {"kind": "image", "data": b64(PNG), "sha256": sha(PNG), "media_type": "image/png"}
    again = Conversation.from_json(text)
    assert again == conversation
    assert again.messages[1].parts[1].sha256 == sha(PNG)  # type: ignore[union-attr]
    assert again.messages[3].tool_results[0].attachments[0].sha256 == sha(JPEG)


def test_small_media_stay_inline_even_with_a_store() -> None:
    store = MemoryBlobStore()
    text = _image_conversation(ImagePart(data=PNG)).to_json(blobs=store)
    assert len(store) == 0 and b64(PNG) in text


def test_large_media_go_to_the_store_and_the_json_keeps_hash_and_media_type_only(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path / "blobs")
    conversation = _image_conversation(ImagePart(data=BIG_PNG))
    text = conversation.to_json(blobs=store)
    assert len(text) < 10_000
    part = json.loads(text)["messages"][1]["parts"][1]
    assert part == {"kind": "image", "sha256": sha(BIG_PNG), "media_type": "image/png"}
    assert sha(BIG_PNG) in store and (tmp_path / "blobs" / sha(BIG_PNG)[:2] / sha(BIG_PNG)).read_bytes() == BIG_PNG
    again = Conversation.from_json(text, blobs=FolderBlobStore(tmp_path / "blobs"))
    assert again == conversation and again.messages[1].parts[1].data == BIG_PNG  # type: ignore[union-attr]


def test_without_a_store_large_media_are_inline_and_nothing_is_lost() -> None:
    conversation = _image_conversation(ImagePart(data=BIG_PNG))
    text = conversation.to_json()
    assert len(text) > INLINE_LIMIT and Conversation.from_json(text) == conversation


def test_loading_without_the_store_names_the_missing_hash() -> None:
    text = _image_conversation(ImagePart(data=BIG_PNG)).to_json(blobs=MemoryBlobStore())
    with pytest.raises(MissingBlobError) as caught:
        Conversation.from_json(text)
    assert caught.value.sha256 == sha(BIG_PNG) and sha(BIG_PNG) in str(caught.value)
    with pytest.raises(MissingBlobError):
        Conversation.from_json(text, blobs=MemoryBlobStore())  # a store that lacks it


def test_a_corrupt_blob_is_a_typed_error(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    text = _image_conversation(ImagePart(data=BIG_PNG)).to_json(blobs=store)
    store.path_of(sha(BIG_PNG)).write_bytes(b"tampered")
    with pytest.raises(BlobIntegrityError):
        Conversation.from_json(text, blobs=store)


def test_the_store_is_content_addressed_and_idempotent(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path, inline_limit=0)
    image = ImagePart(data=PNG)
    conversation = Conversation(messages=[Message.user("a", image), Message.user("b", image)])
    conversation.to_json(blobs=store)
    conversation.to_json(blobs=store)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [sha(PNG)]
    assert store.put(PNG) == sha(PNG) and store.get(sha(PNG)) == PNG


# -- Anthropic wire JSON ---------------------------------------------------------------------------------
def test_anthropic_encodes_images_documents_and_tool_result_images() -> None:
    conversation = _image_conversation(ImagePart(data=PNG))
    conversation.messages[1].parts.append(DocumentPart(url="https://x/r.pdf", title="Report"))
    system, messages = anthropic_wire.encode_conversation(conversation)
    assert system == [{"type": "text", "text": "Look closely."}]
    assert messages[0]["content"] == [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        {"type": "document", "source": {"type": "url", "url": "https://x/r.pdf"}, "title": "Report"},
    ]
    [result] = messages[2]["content"]
    assert result == {"type": "tool_result", "tool_use_id": "call_1", "content": [
        {"type": "text", "text": "the screen:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)}},
    ]}


@pytest.mark.parametrize("image", [ImagePart(data=PNG), ImagePart(url="https://example.com/a.webp")])
def test_anthropic_round_trip_keeps_parts_and_hashes(image: ImagePart) -> None:
    conversation = _image_conversation(image)
    conversation.messages[1].parts.append(DocumentPart(data=PDF, title="Q3"))
    body = anthropic_wire.build_request("claude", conversation, max_tokens=64)
    decoded, _ = anthropic_wire.decode_request(json.loads(json.dumps(body)))
    assert decoded.messages[1].parts == conversation.messages[1].parts
    assert decoded.messages[1].parts[1].sha256 == image.sha256  # type: ignore[union-attr]
    assert decoded.messages[3].tool_results[0].attachments == conversation.messages[3].tool_results[0].attachments
    assert decoded.messages[3].tool_results[0].content == "the screen:"


def test_anthropic_decoder_names_malformed_media_fields() -> None:
    def param(block: dict) -> str | None:
        with pytest.raises(ProtocolError) as caught:
            anthropic_wire.decode_request({"messages": [{"role": "user", "content": [block]}]})
        return caught.value.param

    at = "messages[0].content[0]"
    assert param({"type": "image"}) == f"{at}.source"
    assert param({"type": "image", "source": {"type": "file", "file_id": "f"}}) == f"{at}.source.type"
    assert param({"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": b64(PNG)}}) \
        == f"{at}.source.media_type"
    assert param({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%"}}) \
        == f"{at}.source.data"
    assert param({"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}) \
        == f"{at}.source.media_type"
    assert param({"type": "image", "source": {"type": "url", "url": ""}}) == f"{at}.source.url"


def test_anthropic_refuses_media_in_system_and_assistant_messages() -> None:
    with pytest.raises(UnsupportedPartError) as caught:
        anthropic_wire.encode_conversation([Message(role=Role.SYSTEM, parts=[ImagePart(data=PNG)]),
                                            Message.user("hi")])
    assert caught.value.param == "messages[0].content[0]"


# -- OpenAI wire JSON ------------------------------------------------------------------------------------
def test_openai_encodes_images_as_image_url_and_pdfs_as_file_data() -> None:
    conversation = Conversation(messages=[Message.user(
        "Compare:", ImagePart(data=PNG), ImagePart(url="https://x/y.gif"), DocumentPart(data=PDF, title="r.pdf"))])
    [user] = openai_wire.encode_conversation(conversation)
    assert user["content"] == [
        {"type": "text", "text": "Compare:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG)}},
        {"type": "image_url", "image_url": {"url": "https://x/y.gif"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64," + b64(PDF), "filename": "r.pdf"}},
    ]
    assert openai_wire.encode_conversation([Message.user("plain")]) == [{"role": "user", "content": "plain"}]


def test_openai_sends_tool_result_images_after_the_tool_messages() -> None:
    calls = [ToolCall(id="call_1", name="shot", arguments="{}"), ToolCall(id="call_2", name="shot", arguments="{}")]
    messages = [Message.user("go"), Message.assistant(tool_calls=calls),
                Message.tool("call_1", "shot", "one", attachments=[ImagePart(data=PNG)]),
                Message.tool("call_2", "shot", "two"), Message.user("and?")]
    wire = openai_wire.encode_conversation(messages)
    assert [m["role"] for m in wire] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert wire[2]["content"] == "one"
    assert wire[4]["content"] == [
        {"type": "text", "text": "Attached to the result of shot (call call_1):"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG)}},
    ]


def test_openai_cannot_send_a_pdf_by_url() -> None:
    with pytest.raises(UnsupportedPartError) as caught:
        openai_wire.encode_conversation([Message.user("read", DocumentPart(url="https://x/r.pdf"))])
    assert caught.value.param == "messages[0].content[1]" and caught.value.kind == "document"


@pytest.mark.parametrize("image", [ImagePart(data=PNG), ImagePart(url="https://example.com/a.png")])
def test_openai_round_trip_keeps_parts_and_hashes(image: ImagePart) -> None:
    message = Message.user("What is this?", image, DocumentPart(data=PDF, title="q3.pdf"))
    body = openai_wire.build_request("gpt", [message])
    decoded, _ = openai_wire.decode_request(json.loads(json.dumps(body)))
    assert decoded.messages == [message]
    assert decoded.messages[0].parts[1].sha256 == image.sha256  # type: ignore[union-attr]


def test_openai_decoder_names_malformed_media_fields() -> None:
    def param(part: dict) -> str | None:
        with pytest.raises(ProtocolError) as caught:
            openai_wire.decode_request({"messages": [{"role": "user", "content": [part]}]})
        return caught.value.param

    at = "messages[0].content[0]"
    assert param({"type": "image_url", "image_url": {}}) == f"{at}.image_url.url"
    assert param({"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}) == f"{at}.image_url.url"
    assert param({"type": "file", "file": {"file_id": "file-1"}}) == f"{at}.file.file_id"
    assert param({"type": "file", "file": {"file_data": "data:text/plain;base64,AAAA"}}) == f"{at}.file.file_data"
    assert param({"type": "file"}) == f"{at}.file"


# -- text-only codecs refuse, naming the part ---------------------------------------------------------------
def test_the_chat_template_codec_refuses_media_naming_the_part() -> None:
    codec = ChatTemplateCodec(style="chatml")
    conversation = _image_conversation(ImagePart(url="https://x/y.png"))
    with pytest.raises(UnsupportedPartError) as caught:
        codec.render(conversation)
    error = caught.value
    assert (error.param, error.where, error.kind) == ("messages[1].content[1]", "messages[1].content[1]", "image")
    assert str(error) == "messages[1].content[1]: image input is not supported by this model (text only)"


def test_the_chat_template_codec_refuses_a_tool_results_image() -> None:
    conversation = _image_conversation(ImagePart(url="https://x/y.png"))
    conversation.messages[1].parts.pop()
    with pytest.raises(UnsupportedPartError) as caught:
        ChatTemplateCodec(style="chatml").render(conversation)
    assert caught.value.param == "messages[3].tool_results[0].attachments[0]"


def test_harmony_refuses_media_naming_the_part() -> None:
    messages = [Message.user("read this"), Message.user("and this", DocumentPart(data=PDF))]
    with pytest.raises(UnsupportedPartError) as caught:
        harmony.render_conversation_for_completion(messages)
    assert caught.value.param == "messages[1].content[1]" and caught.value.kind == "document"
