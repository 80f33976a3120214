#!/usr/bin/env bash
# Issue 20, our decode kernel's tuned heuristic and planned launches on the H200: the plan's
# GPU tests, the L2-flush A/B (tools/gpu/decode_flush_ab.py: how much of a short call's
# time the flush's dirty lines cost, ours and SDPA), then `fa-bench run` on
# tools/gpu/decode_check.toml (25 cases: triton and SDPA,
# flex at b64 x 8k; bf16, D 128), then the issue-20 view of the results
# (tools/gpu/decode_check_report.py), printed and packed with the logs into ONE file,
# $OUT/decode-check.tar.gz. LIMIT (default 120 s) bounds the whole; an interrupted run
# keeps the cases it finished.
#
# From the repository root:  LIMIT=120 bash tools/gpu/decode_check.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
WORK=fa-bench-out/decode-check
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
LIMIT=${LIMIT:-120}
STEPS="$WORK/steps.log"
left() { echo $((LIMIT - SECONDS)); }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='commit %h %s' 2> /dev/null
} >> "$STEPS" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] gpu tests: start" >> "$STEPS"
timeout -s TERM -k 5 25 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_kernel_plan.py > "$WORK/tests.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] gpu tests: exit $?" >> "$STEPS"
tail -5 "$WORK/tests.log" | grep -E "passed|failed|error" >> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] flush A/B: start" >> "$STEPS"
timeout -s TERM -k 5 25 python3 tools/gpu/decode_flush_ab.py > "$WORK/flush_ab.md" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] flush A/B: exit $?" >> "$STEPS"
budget=$(($(left) - 12))
echo "[$(date -u +%T) +${SECONDS}s] run: start (limit ${budget} s)" >> "$STEPS"
timeout -s TERM -k 5 "$budget" fa-bench run -s tools/gpu/decode_check.toml \
  --max-time 0.2 --warmup 200 --no-report --out "$WORK/run" > "$WORK/run.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] run: exit $?" >> "$STEPS"
python3 tools/gpu/decode_check_report.py "$WORK/run/results.json" \
  ${COPY_GBPS:+--copy-gbps "$COPY_GBPS"} > "$WORK/decode_check.md" 2>> "$STEPS"
echo "done after ${SECONDS} s" >> "$STEPS"
cat "$STEPS" "$WORK/flush_ab.md" "$WORK/decode_check.md"
tar -czf "$OUT/decode-check.tar.gz" -C "$WORK" steps.log tests.log flush_ab.md run.log \
  decode_check.md run/results.json 2> /dev/null
