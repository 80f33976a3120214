#!/usr/bin/env bash
# Issue 20 on the H200: sessions 5 and 6's decode GPU calls, one script with a mode
# (tools/gpu/decode_s5.sh and decode_s6.sh merged; their commits keep the old names: s5's
# MODE=ab is fused-ab here, s6's MODE=ab launches-ab, s5's MODE=targets is
# SUITE=tools/gpu/decode_targets.toml TESTS=1 MODE=targets). From the repository root,
# after the device prefix:
#
#   MODE=fused-ab LIMIT=100 bash tools/gpu/decode_gpu.sh       (session 5 call B: ~100 s)
#     1. the decode GPU tests (below);
#     2. tools/gpu/decode_ab.py --mode fused: two-kernel vs fused combine, zeroing vs
#        reading L2 flush, SDPA beside them, over issue 20's target shapes, and the fused
#        launch at other split counts where a target is missed;
#   MODE=launches-ab LIMIT=85 bash tools/gpu/decode_gpu.sh     (session 6 call B: ~85 s)
#     1. tests/test_timing_flush.py's GPU test alone (not beside other GPU tests);
#     2. tools/gpu/decode_ab.py --mode launches: the heuristic's launch and candidate
#        launches (split count, key block, stages, warps; the split kernel alone beside
#        the whole call) at batch 8 x 8k and paged batch 64 x 128k, SDPA beside them;
#   [TESTS=1] [RUN=<folder>] MODE=suite LIMIT=300 bash tools/gpu/decode_gpu.sh
#     `fa-bench run -s decode` under the time left, into $W/run; RUN=<an earlier run's
#     folder, carried> continues it (copied, then --resume); then the summaries;
#   [TESTS=1] [AB_BATCH=8 [AB_S=25]] [SUITE=toml] MODE=targets LIMIT=90 bash tools/gpu/decode_gpu.sh
#     AB_BATCH: decode_ab.py --mode launches at that batch's shapes for AB_S seconds;
#     then `fa-bench run` of issue 20's 48 target cases (SUITE, default
#     tools/gpu/decode_targets_s6.toml: each target's nearest shapes first), then the
#     summaries.
# TESTS=1 (always in fused-ab): first the decode GPU tests under -n 4 (each outcome
# listed): the fused combine, the planned and bound launches, the L2 flush, PDL. The
# summaries: tools/gpu/decode_summary.py (each issue-20 target met or missed, with the
# numbers) and decode_check_report.py (the per-case table).
#
# Everything lands in $OUT/decode-$MODE/ (steps.log first), packed into
# $OUT/decode-$MODE.tgz. LIMIT bounds the whole (tools/gpu/steps.sh).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
MODE=${MODE:-targets}
case "$MODE" in
  fused-ab) LIMIT=${LIMIT:-100} TESTS=1 ;;
  launches-ab) LIMIT=${LIMIT:-85} ;;
  suite) LIMIT=${LIMIT:-300} ;;
  targets) LIMIT=${LIMIT:-90} ;;
  *)
    echo "MODE must be fused-ab, launches-ab, suite or targets, got '$MODE'" >&2
    exit 2
    ;;
esac
W=$OUT/decode-$MODE
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

ab() {  # MODE-of-decode_ab.py DEADLINE CAP [its arguments]
  local mode=$1 deadline=$2 cap=$3
  shift 3
  DEADLINE_S=$deadline step ab "$cap" python3 tools/gpu/decode_ab.py --mode "$mode" "$@" \
    --json "$W/decode_ab.json" > "$W/decode_ab.md" 2> "$W/decode_ab.err"
  cat "$W/decode_ab.md"
}

if [ "${TESTS:-0}" = 1 ]; then
  # -rA: each test's outcome; --maxfail keeps a broken kernel from eating the step's time
  STEP_MIN=10 step tests 45 python3 -m pytest -q -rA --maxfail 4 -m gpu -n 4 \
    -p no:cacheprovider tests/test_decode_fused.py tests/test_decode_kernel_plan.py \
    tests/test_timing_flush.py tests/test_decode_pdl.py > "$W/tests.log" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$W/tests.log" | tail -20 | tee -a "$STEPS"
fi
case "$MODE" in
  fused-ab)
    # the tool stops between shapes at DEADLINE_S; the step's timeout is the backstop
    ab fused $(($(left) - 25)) 90
    ;;
  launches-ab)
    STEP_MIN=5 step flush 20 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider \
      tests/test_timing_flush.py > "$W/tests_flush.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$W/tests_flush.log" | tail -4 | tee -a "$STEPS"
    ab launches $(($(left) - 14)) 70
    ;;
  suite | targets)
    [ -n "${AB_BATCH:-}" ] && ab launches "${AB_S:-25}" $((${AB_S:-25} + 15)) --batch "$AB_BATCH"
    RUN_DIR=$W/run
    if [ "$MODE" = suite ] && [ -n "${RUN:-}" ] && [ -f "$RUN/plan.json" ]; then
      rm -rf "$RUN_DIR" && cp -r "$RUN" "$RUN_DIR" && chmod -R u+w "$RUN_DIR"
      echo "resuming $RUN (copied to $RUN_DIR)" | tee -a "$STEPS"
      step run 600 fa-bench run --resume "$RUN_DIR" --no-report > "$W/run.log" 2>&1
    else
      SUITE=${SUITE:-tools/gpu/decode_targets_s6.toml}
      [ "$MODE" = suite ] && SUITE=decode
      step run 600 fa-bench run -s "$SUITE" --max-time 0.2 --warmup 200 --no-report \
        --out "$RUN_DIR" > "$W/run.log" 2>&1
    fi
    tail -4 "$W/run.log" | tee -a "$STEPS"
    STEP_MIN=3 STEP_RESERVE=1 step summary 20 python3 tools/gpu/decode_summary.py \
      "$RUN_DIR/results.json" --json "$W/decode_summary.json" > "$W/decode_summary.md" 2>&1
    STEP_MIN=3 STEP_RESERVE=1 step table 20 python3 tools/gpu/decode_check_report.py \
      "$RUN_DIR/results.json" > "$W/decode_table.md" 2>&1
    cat "$W/decode_summary.md"
    ;;
esac
echo "done after ${SECONDS} s" | tee -a "$STEPS"
tar -czf "$OUT/decode-$MODE.tgz" -C "$OUT" "decode-$MODE" 2> /dev/null
