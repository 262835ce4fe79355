"""Shared test fixtures and paths."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(autouse=True)
def _own_execution_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test gets its own default execution ledger file (`parley.ledger`), inherited by the
    processes it starts: tests that resume one saved state twice stay independent, and nothing is
    written to the user's ~/.local/state."""
    monkeypatch.setenv("PARLEY_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"))
    yield
    ledger = sys.modules.get("parley.ledger")
    if ledger is not None:
        ledger.close_shared()
