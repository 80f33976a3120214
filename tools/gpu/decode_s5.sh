#!/usr/bin/env bash
# Issue 20 on the H200, session 5. From the repository root, after the device prefix:
#
#   MODE=ab LIMIT=100 bash tools/gpu/decode_s5.sh      (call B: ~100 s)
#     1. the decode GPU tests: the fused combine bit for bit the two-kernel launch, a
#        planned fused launch re-launched 200 times, the bound launches, the L2 flush;
#     2. tools/gpu/decode_fused_ab.py: two-kernel vs fused combine, zeroing vs reading L2
#        flush, SDPA beside them, over issue 20's target shapes, and the fused launch at
#        other split counts where a target is missed;
#   [TESTS=1] MODE=suite LIMIT=300 bash tools/gpu/decode_s5.sh   (~300 s; TESTS=1
#     runs step 1 first)
#   MODE=targets LIMIT=150 bash tools/gpu/decode_s5.sh   (the last call: ~150 s)
#     step 1, then steps 3-4 on tools/gpu/decode_targets.toml (the suite's cases where
#     issue 20 sets a bandwidth target, triton and sdpa: 48 cases, ~90 s)
#     3. `fa-bench run -s decode` under the time left, into $OUT/decode-s5-suite/run; a
#        later call continues it with RUN=<that folder, carried> (copied, then --resume);
#     4. tools/gpu/decode_summary.py: each issue-20 target met or missed, with the numbers
#        (÷ copy per target case, ours ÷ best peer with the exceptions, NVML ÷ model,
#        statuses and reasons); tools/gpu/decode_check_report.py: the per-case table.
#
# Everything lands in $OUT/decode-s5-$MODE/ (steps.log first), packed into
# $OUT/decode-s5-$MODE.tgz as well. LIMIT bounds the whole (tools/gpu/steps.sh).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
MODE=${MODE:-ab}
case "$MODE" in
  ab) LIMIT=${LIMIT:-100} ;;
  suite) LIMIT=${LIMIT:-300} ;;
  targets) LIMIT=${LIMIT:-150} TESTS=${TESTS:-1} ;;
  *) echo "MODE must be ab, suite or targets, got '$MODE'" >&2; exit 2 ;;
esac
W=$OUT/decode-s5-$MODE
mkdir -p "$W"
STEPS=$W/steps.log
STEP_RESERVE=8
# shellcheck source=tools/gpu/steps.sh
source tools/gpu/steps.sh
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='commit %h %s' 2> /dev/null
} >> "$STEPS" 2>&1

if [ "$MODE" = ab ] || [ -n "${TESTS:-}" ]; then
  # -rfE: the failures' one-line reasons before the summary; --maxfail keeps a broken
  # kernel from eating the step's time
  step tests 45 python3 -m pytest -q -rfE --maxfail 4 -m gpu -n 4 -p no:cacheprovider \
    tests/test_decode_fused.py tests/test_decode_kernel_plan.py tests/test_timing_flush.py \
    > "$W/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$W/tests.log" | tail -12 | tee -a "$STEPS"
fi
if [ "$MODE" = ab ]; then
  # the tool stops between shapes at DEADLINE_S; the step's timeout is the backstop
  DEADLINE_S=$(($(left) - 25)) step ab 90 python3 tools/gpu/decode_fused_ab.py \
    --json "$W/decode_fused_ab.json" > "$W/decode_fused_ab.md" 2> "$W/decode_fused_ab.err"
  cat "$W/decode_fused_ab.md"
else
  RUN_DIR=$W/run
  if [ -n "${RUN:-}" ] && [ -f "$RUN/plan.json" ]; then
    rm -rf "$RUN_DIR" && cp -r "$RUN" "$RUN_DIR" && chmod -R u+w "$RUN_DIR"
    echo "resuming $RUN (copied to $RUN_DIR)" | tee -a "$STEPS"
    step run 600 fa-bench run --resume "$RUN_DIR" --no-report > "$W/run.log" 2>&1
  else
    SUITE=decode
    [ "$MODE" = targets ] && SUITE=tools/gpu/decode_targets.toml
    step run 600 fa-bench run -s "$SUITE" --max-time 0.2 --warmup 200 --no-report \
      --out "$RUN_DIR" > "$W/run.log" 2>&1
  fi
  tail -4 "$W/run.log" | tee -a "$STEPS"
  STEP_MIN=3 STEP_RESERVE=1 step summary 20 python3 tools/gpu/decode_summary.py \
    "$RUN_DIR/results.json" --json "$W/decode_summary.json" > "$W/decode_summary.md" 2>&1
  STEP_MIN=3 STEP_RESERVE=1 step table 20 python3 tools/gpu/decode_check_report.py \
    "$RUN_DIR/results.json" > "$W/decode_table.md" 2>&1
  cat "$W/decode_summary.md"
fi
echo "done after ${SECONDS} s" | tee -a "$STEPS"
tar -czf "$OUT/decode-s5-$MODE.tgz" -C "$OUT" "decode-s5-$MODE" 2> /dev/null
