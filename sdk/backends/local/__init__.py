"""The local backend: parley's own engine behind the `Backend` protocol, as one local turn.

    backend.py           `LocalBackend` (and the per-process `shared_engine`)
    turn.py              `LocalTurn`: render, hooks, sampling, the engine stream, parsing, usage; the
                         server's routes run the very same turn (`parley.server.turn`)
    engine_port.py       `EnginePort`: the typed seam to `parley.local_engine.Engine` (or a fake)
    family.py            `PromptFamily`: the contract a prompt family fulfils (render, stop ids, parser, hooks)
    codec.py             `codec_for`: picks the family for a tokenizer
    chat_template.py     `ChatTemplatePrompts`: ChatML / the model's own template, with the text-marker hooks
    harmony.py           `HarmonyPrompts`: gpt-oss's Harmony format
    harmony_hooks.py     the structure-aware Harmony hook (headers, arguments by recipient, budget)
    harmony_tokenizer.py the o200k_harmony tokenizer, built locally from the o200k vocabulary
    constraints.py       what every family's hook policy shares: callable tools, schema checks, compiling
"""

from parley.backends.local.backend import DEFAULT_MAX_TOKENS, LocalBackend, shared_engine

__all__ = ["DEFAULT_MAX_TOKENS", "LocalBackend", "shared_engine"]
