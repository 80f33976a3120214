#!/usr/bin/env bash
# Issue 20 on the H200, session 7 (batch 8 x 8k: Sq 4, 64/8 heads). From the repository
# root, after the device prefix:
#
#   MODE=ab LIMIT=90 bash tools/gpu/decode_s7.sh                      (call 1)
#     1. tools/gpu/decode_s7_ab.py (DEADLINE_S: the time left less the tests' share):
#        SDPA, the heuristic (and its split kernel alone) and candidate launches at the
#        batch 8 x 8k cases (Sq 4 contiguous / page 64, 64/8 heads, Sq 1 at pages 0/64/256)
#        and neighbours (batch 8 x 32k, batch 64 x 8k); then the shuffled against an
#        ordered block table at target 3's peer exceptions (batch 64 x 32k, 8 x 128k,
#        256 x 8k page 16);
#     2. tests/test_decode_s7_gpu.py: every candidate launch against the float64
#        reference (-n 8 where xdist is installed).
#   [AB_S=40] [TESTS=1] MODE=targets LIMIT=90 bash tools/gpu/decode_s7.sh  (call 2)
#     AB_S: first decode_s7_ab.py for AB_S seconds; TESTS=1: the GPU tests
#     (tests/test_decode_s7_gpu.py, the PDL tests);
#     then `fa-bench run -s tools/gpu/decode_s7_targets.toml` (the batch 8 x 8k cases of
#     the decode suite, then neighbours), tools/gpu/decode_summary.py and
#     decode_check_report.py on what it measured.
#
# Everything lands in $OUT/decode-s7-$MODE/ (steps.log first), packed into
# $OUT/decode-s7-$MODE.tgz. LIMIT bounds the whole (tools/gpu/steps.sh).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
MODE=${MODE:-ab}
case "$MODE" in
  ab | targets) LIMIT=${LIMIT:-90} ;;
  *) echo "MODE must be ab or targets, got '$MODE'" >&2; exit 2 ;;
esac
W=$OUT/decode-s7-$MODE
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
} >> "$STEPS" 2>&1
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 8)

gpu_tests() {  # $1: the step's cap in seconds; the rest: test files
  local cap=$1
  shift
  step tests "$cap" python3 -m pytest -q -rfE -m gpu -p no:cacheprovider "${XDIST[@]}" \
    "$@" > "$W/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$W/tests.log" | tail -12 | tee -a "$STEPS"
}

if [ "$MODE" = ab ]; then
  TEST_S=${TEST_S:-20}
  AB_S=$(($(left) - TEST_S - 12))
  step ab $((AB_S + 10)) env DEADLINE_S=$AB_S python3 tools/gpu/decode_s7_ab.py \
    --json "$W/decode_s7_ab.json" > "$W/decode_s7_ab.md" 2> "$W/decode_s7_ab.err"
  tail -3 "$W/decode_s7_ab.err" >> "$STEPS"
  gpu_tests "$TEST_S" tests/test_decode_s7_gpu.py
else
  if [ -n "${AB_S:-}" ]; then
    # the A/B first, for AB_S seconds (its most wanted shapes come first)
    step ab $((AB_S + 10)) env DEADLINE_S="$AB_S" python3 tools/gpu/decode_s7_ab.py \
      --json "$W/decode_s7_ab.json" > "$W/decode_s7_ab.md" 2> "$W/decode_s7_ab.err"
    tail -3 "$W/decode_s7_ab.err" >> "$STEPS"
  fi
  if [ "${TESTS:-0}" = 1 ]; then
    gpu_tests "${TEST_S:-30}" tests/test_decode_s7_gpu.py tests/test_decode_pdl.py
  fi
  RUN_DIR=$W/run
  step run 600 fa-bench run -s tools/gpu/decode_s7_targets.toml --max-time 0.2 --warmup 200 \
    --no-report --out "$RUN_DIR" > "$W/run.log" 2>&1
  tail -4 "$W/run.log" | tee -a "$STEPS"
  STEP_MIN=3 STEP_RESERVE=1 step summary 15 python3 tools/gpu/decode_summary.py \
    "$RUN_DIR/results.json" --json "$W/decode_summary.json" > "$W/decode_summary.md" 2>&1
  STEP_MIN=3 STEP_RESERVE=1 step table 15 python3 tools/gpu/decode_check_report.py \
    "$RUN_DIR/results.json" > "$W/decode_table.md" 2>&1
fi
echo "done after ${SECONDS} s" | tee -a "$STEPS"
tar -czf "$OUT/decode-s7-$MODE.tgz" -C "$OUT" "decode-s7-$MODE" 2> /dev/null
