"""`parley bench`'s workloads (local_engine/bench.py) on a tiny engine: each returns sane figures."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from parley.local_engine.bench import EngineBench, chat_ids, document_ids, table  # noqa: E402


class WordTokenizer:
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [3 + (sum(map(ord, w)) % 300) for w in text.split()]


def test_workloads_return_positive_figures(tiny_engine: Any) -> None:
    tok = WordTokenizer()
    assert len(document_ids(tok, 100)) == 100 and chat_ids(tok, "a b c") == tok.encode("a b c")
    b = EngineBench(tiny_engine, runs=2)
    rate, tokens = b.decode([5, 6, 7], 8)
    assert len(tokens) == 8 and len(rate.values) == 2 and rate.median > 0
    assert b.prefill(document_ids(tok, 40)).best_low > 0
    assert b.batch([[5, 6], [7, 8, 9], [10]], 4).median > 0
    hit, cold = b.cached_ttft(document_ids(tok, 40), [[11], [12], [13]])
    assert len(hit.values) == len(cold.values) == 2
    assert tiny_engine.stats()["prefix_cache_hits"] > 0


def test_table_lists_every_mode() -> None:
    result = {"threads": 2, "runs": 1, "load_avg_start": 0.5, "load_avg_end": 0.7,
              "modes": {"fp32": {"decode_tok_s": 40.0}, "int8": {"decode_tok_s": 70.0, "spec_speedup_prose": 1.0}}}
    text = table(result)
    assert "fp32" in text and "int8" in text and "70.0" in text and "load average 0.5 -> 0.7" in text


def test_parley_bench_command_parses_and_refuses_an_unknown_mode(capsys: Any) -> None:
    from parley.cli import build_parser, main

    args = build_parser().parse_args(["bench", "--modes", "int8", "--threads", "1", "--json", "--no-spec"])
    assert args.func.__name__ == "_bench" and args.modes == "int8" and args.json and args.no_spec
    assert main(["bench", "--modes", "fp32,int4"]) == 2
    assert "unknown mode 'int4'" in capsys.readouterr().err
