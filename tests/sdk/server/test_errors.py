"""The server answers an engine refusal by the error's type, never by the words of its message."""

from __future__ import annotations

import pytest

from parley.local_engine.errors import (
    AdmissionError,
    DeadlineUnreachableError,
    EngineError,
    InvalidRequestError,
    QueueFullError,
    RequestAborted,
)
from parley.server.errors import engine_error


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (QueueFullError("no room right now"), 429, "queue_full"),
        (DeadlineUnreachableError("the waiting queue is full"), 503, "deadline_unreachable"),  # the words do not decide
        (AdmissionError("queue full"), 503, None),  # an admission refusal of no known kind: try again later
        (RequestAborted("dropped past its deadline"), 503, None),
        (InvalidRequestError("max_tokens must be >= 1"), 400, None),
    ],
)
def test_an_engine_error_maps_to_its_status_by_type(error: EngineError, status: int, code: str | None) -> None:
    assert isinstance(error, (AdmissionError, RequestAborted, InvalidRequestError))
    api = engine_error(error)
    assert (api.status, api.code) == (status, code)
    assert (api.retry_after_s is not None) == (status != 400)
    assert str(error) in api.message


def test_the_engine_retry_hint_becomes_retry_after() -> None:
    api = engine_error(QueueFullError("full", retry_after_s=2.5))
    assert api.headers() == {"retry-after": "3"}
    assert engine_error(DeadlineUnreachableError("late")).headers() == {"retry-after": "1"}
