#!/usr/bin/env bash
# One prepared device check for the local engine: parity with HF transformers and the engine-vs-HF benchmark,
# on CUDA when a GPU is present, else on the CPU (where it is a quick smoke run of the same paths).
#
#   benchmarks/gpu_check.sh            # auto: cuda if torch sees one
#   QUICK=1 benchmarks/gpu_check.sh    # shorter benchmark
#
# Output: pytest's summary for the real-model parity tests, then the benchmark table and its JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    DEVICE=cuda
    "$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
else
    DEVICE=cpu
    QUICK=${QUICK:-1}
    echo "device: cpu (no CUDA device visible: smoke run of the CPU paths)"
fi
BENCH_ARGS=(--device "$DEVICE")
if [[ -n "${QUICK:-}" ]]; then BENCH_ARGS+=(--quick); fi

echo "== parity and invariants on $DEVICE (real SmolLM2 weights, fp32) =="
PARLEY_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -s -m model tests/local_engine/test_engine_model.py \
    -k "parity or prefill or concurrent or prefix" -p no:cacheprovider

echo "== engine vs HF generate() on $DEVICE =="
"$PY" benchmarks/engine_vs_hf.py "${BENCH_ARGS[@]}"
