#!/usr/bin/env bash
# Issue 21 part 3 (the Gluon fp8 forward), one command
# under LIMIT seconds (150):
#  (1) tools/gpu/fp8_gluon_check.py --light --quick over $ROLES (ws-c3, ws-c3-oinp,
#      ws-c3-nopp; the budget, CHECK_S, cuts from the end): each launch's correctness (check_fp8_accuracy on every
#      (batch, kv head) slice; the persistent one also with more tiles than SMs) and do_bench TFLOP/s at
#      head_dim 128, 4k/16k, causal and not ($OUT/fp8_gluon.md; no bf16 baseline here:
#      (3) times it);
#  (2) tools/gpu/fp8_pick.py --table: per causality and length the role with the best
#      TFLOP/s that passed, into $FA_BENCH_FP8_GLUON_TABLE for (3) (PICK=0: no check, no
#      pick: (3) runs the heuristic's table);
#  (3) `fa-bench run` forward, fp8_e4m3 and bf16, `-i triton`, head_dim 128, N 4k/16k,
#      causal and not, and its summary $OUT/fp8.md (fp8 ÷ bf16 per shape, the kernel each
#      case ran, every case's accuracy);
#  (4) with the time left (LIMIT=240 leaves them ~80 s), the GPU tests of the fp8 kernels
#      ($TEST_FILES, the three-consumer launch's first; $TESTS_K the -k filter).
# Everything else in $OUT/fp8-final.tgz. From the repository root:
#
#   bash tools/gpu/fp8_final.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
LIMIT=${LIMIT:-150}
ROLES=${ROLES:-ws-c3,ws-c3-oinp,ws-c3-nopp}
# the check step's cap (s); no role starts after CHECK_S - 28 s
CHECK_S=${CHECK_S:-80}
TEST_FILES=${TEST_FILES:-tests/test_flash_gluon_fp8_c3_gpu.py tests/test_flash_gluon_fp8_persist_gpu.py tests/test_flash_gluon_fp8_gpu.py tests/test_fp8_kernel.py}
TESTS_K=${TESTS_K:-not preg and not nopp and not s3}
PICK=${PICK:-1}
FILES="$OUT/fp8-final"
rm -rf "$FILES" fa-bench-out/fp8-final-run "$OUT/fp8_gluon.json"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1

if [ "$PICK" = 1 ]; then
  # (1) the candidates
  step "gluon fp8 check: $ROLES" "$CHECK_S" env FP8_GLUON_BUDGET_S=$((CHECK_S - 28)) \
    python3 tools/gpu/fp8_gluon_check.py --light --quick --roles "$ROLES" \
    > "$FILES/check.log" 2>&1

  # (2) the launches the run takes
  # (the check's own JSON, or its lines if the step's cap cut it before it wrote them up)
  RESULTS="$OUT/fp8_gluon.json"
  [ -f "$RESULTS" ] || RESULTS="$OUT/fp8-gluon-lines.jsonl"
  TABLE=$(python3 tools/gpu/fp8_pick.py --table "$RESULTS" 2>> "$STEPS")
  [ -n "$TABLE" ] && export FA_BENCH_FP8_GLUON_TABLE=$TABLE
fi
echo "FA_BENCH_FP8_GLUON_TABLE=${FA_BENCH_FP8_GLUON_TABLE:-unset: the heuristic table}" | tee -a "$STEPS"

# (3) the benchmark's numbers
step "run fp8_e4m3,bf16" 55 fa-bench run -s standard --mode fwd --dtype fp8_e4m3,bf16 \
  -i triton --head-dim 128 --seqlen 4096,16384 \
  --tuning-cache off --no-report --no-telemetry --max-time 0.3 --min-samples 5 --warmup 100 \
  --out fa-bench-out/fp8-final-run > "$FILES/run.log" 2>&1
cp fa-bench-out/fp8-final-run/results.json "$FILES/results.json" 2>> "$STEPS"
step "summary" 8 python3 tools/gpu/fp8_summary.py fa-bench-out/fp8-final-run/results.json \
  "$OUT/fp8.md" > /dev/null 2>> "$STEPS"

# (4) the GPU tests, with what is left
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 6)
# (the Gluon launches of this call's roles, the dispatch, the adapter, and the tl kernel's)
# shellcheck disable=SC2086  # TEST_FILES: a list of paths
step "gpu tests" 60 python3 -m pytest -q -m gpu -p no:cacheprovider "${XDIST[@]}" \
  -k "$TESTS_K" $TEST_FILES > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/fp8-final.tgz" -C "$FILES" .
