"""Decode on a GPU: parley eager vs CUDA graphs (bf16 and q4) vs HF transformers' eager `generate()`, per batch.

Same GPU, same run, same weights and prompts, greedy with equal output lengths forced on both sides. The model
is SmolLM2-135M's shape with seeded random weights (`--model FOLDER` for a real one): a GPU machine here has
no model files and no registry, and speed depends on the shapes, not the values. Each figure is aggregate
tok/s (batch x new tokens / wall time, prefill included) after one warm-up run of the same shapes, so the
graphs are captured before timing; `capture_s` is what that first run cost over a timed one.

vLLM on the same GPU is not run: its wheels are far past what a device run can carry (64 MiB) and the GPU
machine has no registry; the HTTP comparison with vLLM is benchmarks/serve_vs_peers.py (CPU build).

    python benchmarks/gpu_decode.py [--batches 1,4,16,64] [--tokens 128] [--prompt 64] [--model FOLDER]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
import traceback
from typing import Any

import torch

SMOLLM2_135M = dict(  # the embedded model's config.json (architecture fields)
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, hidden_act="silu",
)


class _Ids:
    eos_token_id = 2

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return ""


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--model", default=None, help="a Hugging Face folder (default: SmolLM2-135M's shape, random)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


def hf_model(args: argparse.Namespace) -> Any:
    import transformers

    if args.model:
        return transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2_135M)).to(torch.bfloat16)


def parley_engine(hf: Any, device: str, quantization: str | None, graphs: bool) -> Any:
    from parley.local_engine import Engine, EngineConfig
    from parley.local_engine.models.llama import LlamaArch, LlamaModel

    arch = LlamaArch.from_hf_config(hf.config.to_dict())
    sd = {k: v.float() for k, v in hf.state_dict().items()}
    net = LlamaModel.from_hf_state_dict(arch, sd, torch.device(device), torch.bfloat16, quantization=quantization)
    cfg = EngineConfig(cuda_graphs=graphs, max_num_seqs=128, max_num_batched_tokens=8192, speculation=None)
    return Engine.from_model(net, _Ids(), model_id=f"bench/{quantization}/{graphs}", config=cfg)


def _generate(engine: Any, prompts: list[list[int]], params: Any) -> Any:
    return lambda: [o.token_ids for o in engine.generate(prompts, params)]


def timed(fn: Any) -> tuple[float, Any]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    from parley.local_engine import SamplingParams

    args = parse()
    batches = [int(b) for b in args.batches.split(",")]
    n = args.tokens
    gen = torch.Generator().manual_seed(1)
    prompts = {b: torch.randint(3, 49152, (b, args.prompt), generator=gen).tolist() for b in batches}
    hf = hf_model(args).to(args.device).eval()
    params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                               "torch": torch.__version__, "tokens": n, "prompt": args.prompt, "batches": batches,
                               "vllm": "not run: no registry on the GPU machine and its wheels exceed a run's 64 MiB"}
    tokens: dict[tuple[str, int], list[list[int]]] = {}
    modes = [("parley_bf16_eager", None, False), ("parley_bf16_graphs", None, True),
             ("parley_q4_eager", "q4", False), ("parley_q4_graphs", "q4", True)]
    for name, quantization, graphs in modes:
        try:
            engine = parley_engine(hf, args.device, quantization, graphs)
        except Exception as exc:  # noqa: BLE001 - one mode failing must not cost the others' figures
            results[name] = f"failed to load: {type(exc).__name__}: {exc}"
            traceback.print_exc()
            continue
        try:
            results[f"{name}_mode"] = engine.mode
            for b in batches:
                run = _generate(engine, prompts[b], params)
                first, _ = timed(run)
                dt, out = timed(run)
                tokens[(name, b)] = out
                results[f"{name}_b{b}_tok_s"] = round(b * n / dt, 1)
                results[f"{name}_b{b}_capture_s"] = round(max(first - dt, 0.0), 3)
            if graphs and engine.runner.graphs is not None:
                results[f"{name}_graphs"] = len(engine.runner.graphs.graphs)
        except Exception as exc:  # noqa: BLE001
            results[name] = f"failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            engine.close()
    for b in batches:
        ids = torch.tensor(prompts[b], device=args.device)
        gen_kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids),
                          pad_token_id=2)
        with torch.inference_mode():
            hf.generate(ids, **gen_kwargs)
            dt, out = timed(functools.partial(hf.generate, ids, **gen_kwargs))
        tokens[("hf_eager", b)] = out[:, args.prompt :].tolist()
        results[f"hf_eager_b{b}_tok_s"] = round(b * n / dt, 1)
    for name, _, _ in modes:
        for b in batches:
            mine, theirs = tokens.get((name, b)), tokens[("hf_eager", b)]
            if mine is not None:
                ratio = results[f"{name}_b{b}_tok_s"] / results[f"hf_eager_b{b}_tok_s"]
                results[f"{name}_b{b}_vs_hf"] = round(ratio, 2)
                results[f"{name}_b{b}_rows_equal_hf"] = sum(x == y for x, y in zip(mine, theirs, strict=True))
            eager = tokens.get((name.replace("graphs", "eager"), b))
            if "graphs" in name and mine is not None and eager is not None:
                results[f"{name}_b{b}_rows_equal_eager"] = sum(x == y for x, y in zip(mine, eager, strict=True))
    print(f"{'tok/s (aggregate)':<22}" + "".join(f"{'b' + str(b):>10}" for b in batches))
    for name in [m[0] for m in modes] + ["hf_eager"]:
        print(f"{name:<22}" + "".join(f"{results.get(f'{name}_b{b}_tok_s', '-'):>10}" for b in batches))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
