#!/usr/bin/env bash
# Issue 20 on the H200, session 8: the combine off the critical path (batch 8 x 8k at
# Sq 4 and 64/8 heads). From the repository root, after the device prefix:
#
#   MODE=ab LIMIT=90 bash tools/gpu/decode_s8.sh                        (call 1)
#     1. tools/gpu/decode_s8_ab.py until its deadline (the time left less the tests'
#        TEST_S and a reserve): SDPA, the heuristic (and its split kernel alone), the
#        combine kernel by rows / by row-block tiles, the fused tile merge, at batch 8 x 8k
#        (Sq 4 and 64/8 heads first), batch 1 x 32k/128k and batch 64 x 8k;
#     2. tools/gpu/decode_s8_pick.py on it (the pick and its reasons into steps.log);
#     3. the GPU tests tests/test_decode_s8_gpu.py (every merge against float64, repeated
#        launches bit for bit with the counters back at 0, many splits).
#   [AB_S=30] [TESTS=1] MODE=targets LIMIT=110 bash tools/gpu/decode_s8.sh  (call 2)
#     AB_S: first the A/B for AB_S seconds and its pick, exported as
#     FA_BENCH_DECODE_COMBINE for what follows (without AB_S: COMBINE, else the
#     committed heuristic); TESTS=1: the GPU tests (s8, PDL, fused); then `fa-bench run -s
#     tools/gpu/decode_s7_targets.toml` (every batch 8 x 8k case of the suite first) and
#     tools/gpu/decode_summary.py / decode_check_report.py on it.
#
# Everything lands in $OUT/decode-s8-$MODE/ (steps.log first), packed into
# $OUT/decode-s8-$MODE.tgz. LIMIT bounds the whole (tools/gpu/steps.sh).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
MODE=${MODE:-ab}
case "$MODE" in
  ab) LIMIT=${LIMIT:-90} ;;
  targets) LIMIT=${LIMIT:-110} ;;
  *) echo "MODE must be ab or targets, got '$MODE'" >&2; exit 2 ;;
esac
W=$OUT/decode-s8-$MODE
rm -rf "$W"
mkdir -p "$W"
STEPS=$W/steps.log
STEP_RESERVE=4 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
source "$(dirname "$0")/steps.sh"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='commit %h %s' 2> /dev/null
  echo "MODE=$MODE LIMIT=$LIMIT AB_S=${AB_S:-} TESTS=${TESTS:-} COMBINE=${COMBINE:-}"
} >> "$STEPS" 2>&1
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 4)

gpu_tests() {  # $1: the step's cap in seconds; the rest: test files
  local cap=$1
  shift
  step tests "$cap" python3 -m pytest -q -rfE -m gpu -p no:cacheprovider "${XDIST[@]}" \
    "$@" > "$W/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$W/tests.log" | tail -12 | tee -a "$STEPS"
}

ab() {  # $1: seconds for the A/B; then its pick into $PICK
  step ab $(($1 + 10)) env DEADLINE_S="$1" python3 tools/gpu/decode_s8_ab.py \
    --json "$W/decode_s8_ab.json" > "$W/decode_s8_ab.md" 2> "$W/decode_s8_ab.err"
  tail -3 "$W/decode_s8_ab.err" >> "$STEPS"
  PICK=$(python3 tools/gpu/decode_s8_pick.py "$W/decode_s8_ab.json" 2>> "$STEPS")
  echo "pick: FA_BENCH_DECODE_COMBINE=$PICK" | tee -a "$STEPS"
}

if [ "$MODE" = ab ]; then
  TEST_S=${TEST_S:-25}
  ab $(($(left) - TEST_S - 14))
  gpu_tests "$TEST_S" tests/test_decode_s8_gpu.py
else
  PICK=${COMBINE:-}
  [ -n "${AB_S:-}" ] && ab "$AB_S"
  # the pick (or COMBINE) for the tests and the run; empty: the committed heuristic
  [ -n "$PICK" ] && export FA_BENCH_DECODE_COMBINE=$PICK
  echo "FA_BENCH_DECODE_COMBINE=${FA_BENCH_DECODE_COMBINE:-(unset: the heuristic)}" >> "$STEPS"
  if [ "${TESTS:-0}" = 1 ]; then
    # the PDL and fused tests assume the committed default combine: without the pick
    # (tests/test_decode_s8_gpu.py's default tests take it)
    gpu_tests "${TEST_S:-30}" tests/test_decode_s8_gpu.py
    mv "$W/tests.log" "$W/tests-s8.log"
    FA_BENCH_DECODE_COMBINE='' gpu_tests 12 tests/test_decode_pdl.py tests/test_decode_fused.py
  fi
  RUN_DIR=$W/run
  # the run until 14 s before the end: the summary and the table need theirs
  step run $(($(left) - 14)) fa-bench run -s tools/gpu/decode_s7_targets.toml --max-time 0.2 --warmup 200 \
    --no-report --out "$RUN_DIR" > "$W/run.log" 2>&1
  tail -4 "$W/run.log" | tee -a "$STEPS"
  STEP_MIN=3 STEP_RESERVE=1 step summary 15 python3 tools/gpu/decode_summary.py \
    "$RUN_DIR/results.json" --json "$W/decode_summary.json" > "$W/decode_summary.md" 2>&1
  STEP_MIN=3 STEP_RESERVE=1 step table 15 python3 tools/gpu/decode_check_report.py \
    "$RUN_DIR/results.json" > "$W/decode_table.md" 2>&1
fi
echo "done after ${SECONDS} s" | tee -a "$STEPS"
tar -czf "$OUT/decode-s8-$MODE.tgz" -C "$OUT" "decode-s8-$MODE" 2> /dev/null
