#!/usr/bin/env bash
# Issue 20 on the H200, session 6. From the repository root, after the device prefix:
#
#   MODE=ab LIMIT=85 bash tools/gpu/decode_s6.sh        (call B: ~85 s)
#     1. tests/test_timing_flush.py's GPU test alone (not beside other GPU tests: its
#        unflushed variant failed under -n 4 in call A);
#     2. tools/gpu/decode_s6_ab.py: the heuristic's launch and candidate launches (split
#        count, key block, stages, warps; the split kernel alone beside the whole call)
#        at batch 8 x 8k (contiguous, page 64, page 256) and paged batch 64 x 128k, SDPA
#        beside them;
#   [TESTS=1] [AB_BATCH=8 [AB_S=25]] MODE=targets LIMIT=90 bash tools/gpu/decode_s6.sh
#     (calls C, D)
#     TESTS=1: first the GPU tests under -n 4 within 35 s (each test's outcome listed):
#     the flush test (beside the others: the contention call A failed it under), the PDL
#     combine bit for bit the plain launch and re-launched;
#     AB_BATCH: decode_s6_ab.py's candidates at that batch's shapes for AB_S seconds;
#     then `fa-bench run` of issue 20's 48 target cases, each target's nearest shapes
#     first (tools/gpu/decode_targets_s6.toml: batch 8 x 8k, batch 1, batch 64 x
#     128k), then tools/gpu/decode_summary.py and decode_check_report.py on what was
#     measured.
#
# Everything lands in $OUT/decode-s6-$MODE/ (steps.log first), packed into
# $OUT/decode-s6-$MODE.tgz. LIMIT bounds the whole (tools/gpu/steps.sh).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
MODE=${MODE:-ab}
case "$MODE" in
  ab) LIMIT=${LIMIT:-85} ;;
  targets) LIMIT=${LIMIT:-90} ;;
  *) echo "MODE must be ab or targets, got '$MODE'" >&2; exit 2 ;;
esac
W=$OUT/decode-s6-$MODE
mkdir -p "$W"
STEPS=$W/steps.log
STEP_RESERVE=6
# shellcheck source=tools/gpu/steps.sh
source tools/gpu/steps.sh
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='commit %h %s' 2> /dev/null
} >> "$STEPS" 2>&1

if [ "$MODE" = ab ]; then
  STEP_MIN=5 step flush 20 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider \
    tests/test_timing_flush.py > "$W/tests_flush.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$W/tests_flush.log" | tail -4 | tee -a "$STEPS"
  DEADLINE_S=$(($(left) - 14)) step ab 70 python3 tools/gpu/decode_s6_ab.py \
    --json "$W/decode_s6_ab.json" > "$W/decode_s6_ab.md" 2> "$W/decode_s6_ab.err"
  cat "$W/decode_s6_ab.md"
else
  if [ "${TESTS:-0}" = 1 ]; then
    # the flush test beside the others under -n 4 this time: the contention that failed
    # it in call A, which its spin and best-of-three rounds are meant to withstand
    STEP_MIN=10 step tests 35 python3 -m pytest -q -rA --maxfail 4 -m gpu -n 4 \
      -p no:cacheprovider tests/test_timing_flush.py tests/test_decode_pdl.py \
      > "$W/tests.log" 2>&1
    grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$W/tests.log" | tail -20 | tee -a "$STEPS"
  fi
  if [ -n "${AB_BATCH:-}" ]; then
    # a short A/B of decode_s6_ab.py's candidates at one batch size's shapes
    DEADLINE_S=${AB_S:-25} step ab $((${AB_S:-25} + 15)) python3 tools/gpu/decode_s6_ab.py \
      --batch "$AB_BATCH" --json "$W/decode_s6_ab.json" > "$W/decode_s6_ab.md" \
      2> "$W/decode_s6_ab.err"
    cat "$W/decode_s6_ab.md"
  fi
  RUN_DIR=$W/run
  step run 600 fa-bench run -s tools/gpu/decode_targets_s6.toml --max-time 0.2 --warmup 200 \
    --no-report --out "$RUN_DIR" > "$W/run.log" 2>&1
  tail -4 "$W/run.log" | tee -a "$STEPS"
  STEP_MIN=3 STEP_RESERVE=1 step summary 20 python3 tools/gpu/decode_summary.py \
    "$RUN_DIR/results.json" --json "$W/decode_summary.json" > "$W/decode_summary.md" 2>&1
  STEP_MIN=3 STEP_RESERVE=1 step table 20 python3 tools/gpu/decode_check_report.py \
    "$RUN_DIR/results.json" > "$W/decode_table.md" 2>&1
  cat "$W/decode_summary.md"
fi
echo "done after ${SECONDS} s" | tee -a "$STEPS"
tar -czf "$OUT/decode-s6-$MODE.tgz" -C "$OUT" "decode-s6-$MODE" 2> /dev/null
