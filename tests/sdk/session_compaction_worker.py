"""Worker for test_session_compaction.py: a compacting run whose commit stalls, to be SIGKILLed.

Usage: python session_compaction_worker.py DB

Runs one turn with a big window, then one that compacts; a temporary trigger on this process's
connection prints ``inside the commit`` and sleeps once the compaction row is inserted (after the
turn's rows), so the parent kills the process inside the open transaction.
"""

from __future__ import annotations

import asyncio
import sys
import time

from parley import SQLiteSession
from tests.sdk.test_session_compaction import _agent, _shrink


def stall() -> int:
    print("inside the commit", flush=True)
    time.sleep(60)
    return 0


async def main() -> None:
    with SQLiteSession("chat", sys.argv[1]) as store:
        backend, agent = _agent()
        await agent.run("now?", session=store)  # committed whole: the parent finds it
        conn = store._connection()
        conn.create_function("stall", 0, stall)
        conn.execute("CREATE TEMP TRIGGER stall_here AFTER INSERT ON main.parley_compactions BEGIN SELECT stall(); END")
        _shrink(backend)
        await agent.run("and Rome?", session=store)


asyncio.run(main())
