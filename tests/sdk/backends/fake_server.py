"""A tiny scripted HTTP/1.1 server on 127.0.0.1 for the hosted-backend tests.

Each test queues `Reply`s; every request (method, path, headers, JSON body) is recorded. Replies
are plain JSON, or server-sent events written with chunked transfer encoding, optionally cut off
in the middle (the connection closes without the final chunk, as a dropped stream does).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    sse: list[str] | None = None
    """Raw SSE records (``event: x\\ndata: {...}``); a record is followed by a blank line."""
    cut_after: int | None = None
    """Stop after this many SSE records and drop the connection mid-stream."""


def sse_event(event: str | None, data: Any) -> str:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {payload}"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeServer:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[Recorded] = []
        self.routes: dict[str, Reply] = {}
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self) -> FakeServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            length = int(headers.get("content-length", "0"))
            raw = await reader.readexactly(length) if length else b""
            body = json.loads(raw) if raw else None
            self.requests.append(Recorded(method, path, headers, body))
            reply = self.routes.get(path) or (self.replies.pop(0) if self.replies else Reply(500, {"error": "none"}))
            await self._write(writer, reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _write(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        reason = {200: "OK", 400: "Bad Request", 429: "Too Many Requests", 500: "Internal Server Error",
                  529: "Overloaded", 503: "Service Unavailable"}.get(reply.status, "Status")
        headers = {"connection": "close", **{k.lower(): v for k, v in reply.headers.items()}}
        if reply.sse is None:
            payload = json.dumps(reply.body).encode()
            headers.setdefault("content-type", "application/json")
            headers["content-length"] = str(len(payload))
            writer.write(self._head(reply.status, reason, headers) + payload)
            await writer.drain()
            return
        headers["content-type"] = "text/event-stream"
        headers["transfer-encoding"] = "chunked"
        writer.write(self._head(reply.status, reason, headers))
        for n, record in enumerate(reply.sse):
            if reply.cut_after is not None and n >= reply.cut_after:
                await writer.drain()
                return  # no terminating chunk: the client sees a broken stream
            data = (record + "\n\n").encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    @staticmethod
    def _head(status: int, reason: str, headers: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()
