"""Sessions: a conversation's history kept between runs, in a database.

    from parley import Agent, SQLiteSession

    session = SQLiteSession("user-42", "chats.db")
    await agent.run("My name is Ada.", session=session)
    result = await agent.run("What is my name?", session=session)   # the model sees the first turn

Stores: `SQLiteSession` (the default: stdlib sqlite3, WAL, safe for several processes),
`MemorySession` (tests), `SQLAlchemySession` (PostgreSQL, MySQL... through SQLAlchemy; the ``sql``
extra). Each implements the `Session` protocol (the OpenAI Agents SDK's: `get_items`, `add_items`,
`pop_item`, `clear_session`, async; parley's stores add sync twins such as `get_items_sync`); write
your own against it.

What ``agent.run(input, session=s)`` does (also `run_sync` and `run_stream`):

* **Before the run** it reads the session; the model sees the instructions, then the session's
  items, then the run's own messages. The history is not copied into the `RunState`: a state
  (and every checkpoint of it) holds only the turn in flight.
* **A turn is written whole, once, at the end.** When the run completes, every message of the
  turn (the user input, the model's turns, tool calls and results, repair prompts, the answer) is
  appended in one transaction, with the run's trace id as turn id. A run that fails (an error,
  `MaxTurnsExceeded`, a crash, SIGKILL) writes nothing: what the session held stays intact, and
  there is never half a turn in it (never a tool call without its result).
* **A paused run writes nothing.** Its turn lives in the `RunState` (save it, or use
  ``checkpoint=``); resume with ``agent.run(state=state, session=s)``, in this or another process.
  The resumed run reads the session afresh (turns other runs completed meanwhile come before this
  one's, in the session and in what the model sees) and writes the whole turn when it completes.
  Resume with the same session: a state does not record which session it belongs to, and without
  one the model would see only the turn.
* **At most once.** Writing is idempotent by trace id: resuming the same state twice (two
  processes, or a retry after a crash between the final checkpoint and the write) or running a
  completed state again writes the turn once. If the write itself failed (locked past the busy
  timeout, a read-only file, a server down), the run still completed: the error, a
  `parley.sessions.errors.SessionStoreError`, carries it as ``.state``; run that state again with the
  session (``agent.run(state=error.state, session=s)``) to write the turn, once. A completed state
  cannot take new input with a session: the next turn is a new run (``agent.run(input, session=s)``).
* **Errors are parley's.** Every store raises the `parley.sessions.errors` family (busy, corrupt,
  read-only, unavailable), never a driver's exception; text no store can hold (a lone surrogate) is
  refused as `UnencodableTextError`, naming the place, before the model is called.
* Concurrent runs on one session each append their own whole turn, in commit order; a run does not
  see a turn that another run commits while it is running.
* **Compaction is recorded with the turn.** When the run compacted (``Agent(compaction=...)``),
  parley's stores write a compaction row in the turn's transaction: the next run reads the live
  history (pinned prefix byte-identical, the summary, the kept tail) instead of the whole old
  history, and asks for no summary again. Replaced messages stay stored (`get_all_items`), with the
  record of each compaction (`compactions`, `StoredCompaction`). See `parley.sessions.base`.
"""

from parley.sessions.base import Session, SessionStore, StoredCompaction
from parley.sessions.memory import MemorySession
from parley.sessions.sqlalchemy_session import SQLAlchemySession
from parley.sessions.sqlite import SQLiteSession

__all__ = ["MemorySession", "SQLAlchemySession", "SQLiteSession", "Session", "SessionStore", "StoredCompaction"]
