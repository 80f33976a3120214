#!/usr/bin/env bash
# Issue 20, our decode kernel's tuned heuristic on the H200: its GPU tests, then
# `fa-bench run` on tools/gpu/decode_check.toml (48 cases: triton and SDPA, flex at
# b64 x 8k; bf16 32/8 heads D128 at b1/b8 x 8k-128k and b64 x 8k, contiguous and page 64;
# pages 16/256, Sq 4, spread 0.25 and 64/8 heads at one shape each), then the issue-20
# view of its results (tools/gpu/decode_check_report.py). LIMIT (default 180 s) bounds
# the whole; an interrupted run keeps the cases it finished.
#
# From the repository root:  LIMIT=180 bash tools/gpu/decode_check.sh
# Files under $OUT: decode-check-steps.log, decode-check-tests.log, decode-check.log,
# decode-check-results.json, decode_check.md.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
WORK=fa-bench-out/decode-check
mkdir -p "$OUT"
rm -rf "$WORK"
LIMIT=${LIMIT:-180}
STEPS="$OUT/decode-check-steps.log"
left() { echo $((LIMIT - SECONDS)); }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='commit %h %s' 2> /dev/null
} >> "$STEPS" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] gpu tests: start" >> "$STEPS"
timeout -s TERM -k 10 40 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_kernel_config.py > "$OUT/decode-check-tests.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] gpu tests: exit $?" >> "$STEPS"
tail -5 "$OUT/decode-check-tests.log" | grep -E "passed|failed|error" >> "$STEPS"
budget=$(($(left) - 15))
echo "[$(date -u +%T) +${SECONDS}s] run: start (limit ${budget} s)" >> "$STEPS"
timeout -s TERM -k 10 "$budget" fa-bench run -s tools/gpu/decode_check.toml \
  --max-time 0.25 --no-report --out "$WORK" > "$OUT/decode-check.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] run: exit $?" >> "$STEPS"
cp "$WORK/results.json" "$OUT/decode-check-results.json" 2>> "$STEPS"
python3 tools/gpu/decode_check_report.py "$WORK/results.json" ${COPY_GBPS:+--copy-gbps "$COPY_GBPS"} \
  > "$OUT/decode_check.md" 2>> "$STEPS"
echo "done after ${SECONDS} s" >> "$STEPS"
