#!/usr/bin/env bash
# Issue 21 part 3, session 8 (F8): the fp8 forward at 4k causal. One command under LIMIT
# seconds (default 100), from the repository root.
#
# PHASE=ab (call 1):
#  (1) tools/gpu/fp8_ab.py over $ROLES (default: the committed table's ws-c3-persist and
#      ws-c3, then ws-c3-lpt (the host's tile plan), ws-c3-lptx (+ own key end, one-compare
#      mask), ws-c3x (those two without persistence)): checks, then do_bench interleaved
#      round by round at d128 4k/16k causal beside the bf16 forward ($OUT/fp8_ab.md);
#  (2) fp8_pick.py --table on its rows: the causal ranges of FA_BENCH_FP8_GLUON_TABLE
#      (non-causal: the committed table's);
#  (3) `fa-bench run` fp8_e4m3 vs bf16, d128 4k/16k causal both, with that table
#      ($OUT/fp8.md);
#  (4) with the time left, the GPU tests of the new launches ($TEST_FILES, -k "$TESTS_K").
# PHASE=final (call 2):
#  (1) `fa-bench run` as (4) with the COMMITTED table (AB=1: (1)-(2) first and the pick);
#  (2) the fp8 GPU tests with the time left.
# Everything else in $OUT/fp8-s8.tgz (steps.log, ab logs, run.log, tests.log).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
LIMIT=${LIMIT:-100}
PHASE=${PHASE:-ab}
AB=${AB:-0}
[ "$PHASE" = ab ] && AB=1
ROLES=${ROLES:-ws-c3-persist,ws-c3,ws-c3-lpt,ws-c3-lptx,ws-c3x}
AB_S=${AB_S:-55}
RUN_S=${RUN_S:-60}
if [ "$PHASE" = ab ]; then
  TEST_FILES=${TEST_FILES:-tests/test_flash_gluon_fp8_lpt_gpu.py tests/test_flash_gluon_fp8_c3_gpu.py}
  TESTS_K=${TESTS_K:-lpt or c3x or oinp}
else
  TEST_FILES=${TEST_FILES:-tests/test_flash_gluon_fp8_lpt_gpu.py tests/test_flash_gluon_fp8_c3_gpu.py tests/test_flash_gluon_fp8_persist_gpu.py tests/test_flash_gluon_fp8_gpu.py tests/test_fp8_kernel.py}
  TESTS_K=${TESTS_K:-not preg and not nopp and not s3}
fi
FILES="$OUT/fp8-s8"
rm -rf "$FILES" fa-bench-out/fp8-s8-run "$OUT/fp8_ab.json" "$OUT/fp8-ab-lines.jsonl"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
steps_header
echo "PHASE=$PHASE AB=$AB ROLES=$ROLES LIMIT=$LIMIT" >> "$STEPS"

run_bench() {
  step "run fp8_e4m3,bf16" "$RUN_S" fa-bench run -s standard --mode fwd \
    --dtype fp8_e4m3,bf16 -i triton --head-dim 128 --seqlen 4096,16384 \
    --tuning-cache off --no-report --no-telemetry --max-time 0.3 --min-samples 5 --warmup 100 \
    --out fa-bench-out/fp8-s8-run > "$FILES/run.log" 2>&1
  cp fa-bench-out/fp8-s8-run/results.json "$FILES/results.json" 2>> "$STEPS"
  step "summary" 8 python3 tools/gpu/fp8_summary.py fa-bench-out/fp8-s8-run/results.json \
    "$OUT/fp8.md" > /dev/null 2>> "$STEPS"
}

run_tests() {
  local xdist=()
  python3 -c "import xdist" 2> /dev/null && xdist=(-n 8)
  # shellcheck disable=SC2086  # TEST_FILES: a list of paths
  step "gpu tests" 200 python3 -m pytest -q -m gpu -p no:cacheprovider "${xdist[@]}" \
    -k "$TESTS_K" $TEST_FILES > "$FILES/tests.log" 2>&1
  tail -3 "$FILES/tests.log" >> "$STEPS"
}

if [ "$AB" = 1 ]; then
  step "fp8 A/B: $ROLES" "$AB_S" python3 tools/gpu/fp8_ab.py --roles "$ROLES" \
    > "$FILES/ab.log" 2>&1
  cp "$OUT"/fp8-ab-child-*.log "$FILES/" 2> /dev/null
  RESULTS="$OUT/fp8_ab.json"
  [ -f "$RESULTS" ] || RESULTS="$OUT/fp8-ab-lines.jsonl"
  TABLE=$(python3 tools/gpu/fp8_pick.py --table "$RESULTS" 2>> "$STEPS")
  [ -n "$TABLE" ] && export FA_BENCH_FP8_GLUON_TABLE=$TABLE
fi
echo "FA_BENCH_FP8_GLUON_TABLE=${FA_BENCH_FP8_GLUON_TABLE:-unset: the committed table}" \
  | tee -a "$STEPS"

# the benchmark first in both phases: the tests take whatever time is left
run_bench
run_tests
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/fp8-s8.tgz" -C "$FILES" .
