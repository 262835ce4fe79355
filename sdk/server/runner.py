"""`BackgroundServer`: run the app with uvicorn in a thread on 127.0.0.1 (tests, benchmarks, notebooks).

Real HTTP on a free port, so official clients talk to it exactly as they would to a remote server.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class BackgroundServer:
    """`with BackgroundServer(app) as server: server.base_url` — started on enter, stopped on exit."""

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"parley-serve-{self.port}", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server thread exited before listening on {self.base_url}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
