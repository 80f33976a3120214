#!/usr/bin/env bash
# Issue 20, our decode kernel's launch parameters on the H200: the GPU tests of the new
# launch options (tests/test_decode_kernel_config.py -m gpu), then the tuning sweep
# (tools/gpu/decode_tune.py) with the time left. LIMIT (default 180 s) bounds the whole.
#
# From the repository root:  LIMIT=180 bash tools/gpu/decode_tune.sh
# Files under $OUT: decode-steps.log, decode-tests.log, decode_tune.md, decode_tune.json,
# decode_tune.log.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-fa-bench-out/out}
mkdir -p "$OUT"
LIMIT=${LIMIT:-180}
STEPS="$OUT/decode-steps.log"
left() { echo $((LIMIT - SECONDS)); }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='commit %h %s' 2> /dev/null
} >> "$STEPS" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] gpu tests: start" >> "$STEPS"
timeout -s TERM -k 10 45 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_kernel_config.py > "$OUT/decode-tests.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] gpu tests: exit $?" >> "$STEPS"
tail -5 "$OUT/decode-tests.log" | grep -E "passed|failed|error" >> "$STEPS"
budget=$(($(left) - 25))
echo "[$(date -u +%T) +${SECONDS}s] tune: start (budget ${budget} s)" >> "$STEPS"
timeout -s TERM -k 10 $((budget + 20)) python3 tools/gpu/decode_tune.py --out "$OUT" \
  --budget "$budget" > "$OUT/decode_tune.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] tune: exit $?" >> "$STEPS"
echo "done after ${SECONDS} s" >> "$STEPS"
