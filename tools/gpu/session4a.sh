#!/usr/bin/env bash
# One H200 call (2026-11-30, session 4, first call): the GPU tests of every kernel path
# changed since the last GPU run (allocator fix for the TMA backward, variant refusals,
# SDPA probe, decode adapters), issue 20's decode benchmark on a subset of the `decode`
# suite (bf16, 32/8 heads, Sq 1, batch 1/8/64, contexts 8k/32k/128k, contiguous and
# page 64), and issue 18's dQ-add A/B (pointer atomics vs the TMA reduce-add).
#
# From the repository root, after the device prefix of ../shared/tools/device-prep.sh:
#   bash tools/gpu/session4a.sh
# Files under $OUT: steps.log, tests.log, decode.log, decode-results.json, tma_ab.md.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
WORK=fa-bench-out/s4a
mkdir -p "$OUT" "$WORK"
LIMIT=${LIMIT:-500}
STEPS="$OUT/steps.log"
STEP_RESERVE=10 STEP_MIN=20 STEP_KILL=15
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
} >> "$STEPS" 2>&1
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 6)
step "gpu tests" 190 python3 -m pytest -q -m gpu -p no:cacheprovider "${XDIST[@]}" \
  tests/test_flash_attention.py tests/test_flash_backward.py tests/test_variant_impls.py \
  tests/test_variant_peers.py tests/test_decode_impls.py tests/test_decode_kernel.py \
  tests/test_peers.py > "$OUT/tests.log" 2>&1
tail -30 "$OUT/tests.log" | grep -E "passed|failed|FAILED|ERROR" >> "$STEPS"

step "decode run" 230 fa-bench run -s decode -i triton -i sdpa -i flex -i naive \
  --dtype bf16 --heads 32 --kv-heads 8 --seqlen-q 1 --batch 1,8,64 \
  --seqlen-k 8192,32768,131072 --page-size none,64 --ctx-spread 1 \
  --max-time 0.4 --no-report --out "$WORK/decode" > "$OUT/decode.log" 2>&1
cp "$WORK/decode/results.json" "$OUT/decode-results.json" 2>> "$STEPS"
step "dQ adds A/B" 70 python3 tools/gpu/issue18_tma_ab.py > "$OUT/tma_ab.md" 2>&1
echo "done after ${SECONDS} s" | tee -a "$STEPS"
