#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA GPU and PyTorch (nothing is downloaded): the
# tests under the `cuda` marker, GPT-2 small's training throughput and MFU against HuggingFace's
# GPT2LMHeadModel (bf16, torch.compile), and generation against HuggingFace `generate`.
# Logs go to $OUT (default gpu-logs/); each part has a time limit, so one that hangs stops alone.
#     bash benchmarks/gpu_check.sh                # everything
#     PARTS="tests" bash benchmarks/gpu_check.sh  # only the tests
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
PARTS=${PARTS:-"tests train generate compiled"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

for part in $PARTS; do
    start=$SECONDS
    case $part in
    tests)  # every test under the marker, in 4 processes sharing the GPU (compiling is CPU work)
        timeout "${TESTS_S:-240}" $PY -m pytest -m cuda tests/test_cuda*.py -q -p no:cacheprovider -o addopts="" \
            -n "${WORKERS:-4}" -rfEs --durations=15 >"$OUT/pytest.log" 2>&1; rc=$?
        tail -40 "$OUT/pytest.log" ;;
    train)  # GPT-2 small, context 1024, batch 32, bf16 autocast, both models compiled
        (cd benchmarks && timeout "${TRAIN_S:-180}" $PY train_throughput.py --models gpt2-small --vocab 50257 \
            --dtypes bfloat16 --compile --batch-size "${TRAIN_BATCH:-32}" --warmup 4 --steps 15) >"$OUT/train.log" 2>&1; rc=$?
        grep -v -i warn "$OUT/train.log" | tail -8 ;;
    generate)  # eager decode steps, batch 1 and 16, float32 and bf16, both shapes
        (cd benchmarks && timeout "${GENERATE_S:-150}" $PY gpu_generate.py --new-tokens "${NEW_TOKENS:-128}" \
            --repeats 2 --no-compile) >"$OUT/generate.log" 2>&1; rc=$?
        grep -v -i warn "$OUT/generate.log" | tail -24 ;;
    compiled)  # the compiled decode step at batch 1 (each shape compiles once), float32
        (cd benchmarks && timeout "${COMPILED_S:-150}" $PY gpu_generate.py --new-tokens "${NEW_TOKENS:-128}" \
            --repeats 2 --dtypes float32 --batch "") >"$OUT/compiled.log" 2>&1; rc=$?
        grep -v -i warn "$OUT/compiled.log" | tail -12 ;;
    esac
    echo "== $part: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/gpu.txt"
done
