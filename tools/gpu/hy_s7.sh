#!/usr/bin/env bash
# HY (session 7: code health and the Gluon forward's host path), one command under LIMIT
# seconds, from the repository root after the device prefix:
#
#   LIMIT=90 bash tools/gpu/hy_s7.sh               (call 1: MODE=dev)
#   MODE=final LIMIT=90 bash tools/gpu/hy_s7.sh    (call 2)
#
# MODE=dev:
#  (1) tools/gpu/host_cost.py at HOST_N (default 1024; d128, 16k tokens): host µs per call
#      of "triton" (planned launches) beside "triton-unplanned" (the JIT every call, as
#      before) and sdpa-cudnn, GPU µs from a CUDA graph, timing.measure's median, a
#      cProfile of the planned calls -> $FILES/host_cost.md
#  (2) the GPU tests of what HY touched: the planned Gluon forward bit for bit against the
#      unplanned launch, a refilled buffer, a CUDA graph (tests/test_flash_gluon_plan.py);
#      the decode plan's bound launch (its _Bound moved to kernels/bound_launch.py); the
#      packed and decode GPU tests (the dQ kernel's loop over the one helper; their
#      helpers moved to tests/packed_gpu.py, tests/decode_sm90.py) -> $FILES/tests.log
# MODE=final:
#  (1) `fa-bench run` forward, triton and sdpa-cudnn, bf16 and fp16, head_dim 64 and 128,
#      N 1k and 2k, causal and not (issue 21's "below 4k, say where we stand"), and
#      tools/gpu/issue21_summary.py's ratio table -> $FILES/short.md, $FILES/results.json
#  (2) host_cost.py at 1k as in dev -> $FILES/host_cost.md
# Everything in $OUT/hy-s7.tgz.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
LIMIT=${LIMIT:-90}
MODE=${MODE:-dev}
FILES="$OUT/hy-s7"
rm -rf "$FILES" fa-bench-out/hy-s7-run
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

steps_header

TESTS="tests/test_flash_gluon_plan.py tests/test_decode_kernel_plan.py
  tests/test_flash_varlen_clamp_gpu.py tests/test_flash_varlen_sched_gpu.py
  tests/test_decode_pdl.py tests/test_decode_kernel.py"

case "$MODE" in
  dev)
    # the host cost first (the A/B's rows print as they come), then the tests, each
    # outcome on its own line (-v) so that a cut step still shows which passed
    step "host cost ${HOST_N:-1024}" 35 python3 tools/gpu/host_cost.py --seqlen "${HOST_N:-1024}" \
      > "$FILES/host_cost.md" 2>&1
    # shellcheck disable=SC2086
    step "gpu tests" 50 python3 -m pytest -v -rfE -m gpu -n 8 -p no:cacheprovider \
      $TESTS > "$FILES/tests.log" 2>&1
    ;;
  final)
    step "run short" 60 fa-bench run -s standard --mode fwd -i triton -i sdpa-cudnn \
      --dtype bf16,fp16 --head-dim 64,128 --seqlen 1024,2048 \
      --tuning-cache off --no-report --no-telemetry --max-time 0.3 --min-samples 5 \
      --warmup 100 --out fa-bench-out/hy-s7-run > "$FILES/run.log" 2>&1
    cp fa-bench-out/hy-s7-run/results.json "$FILES/results.json" 2>> "$STEPS"
    step "summary" 8 python3 tools/gpu/issue21_summary.py fa-bench-out/hy-s7-run \
      > "$FILES/short.md" 2>> "$STEPS"
    step "host cost 1k" 30 python3 tools/gpu/host_cost.py --seqlen 1024 \
      > "$FILES/host_cost.md" 2>&1
    ;;
  *)
    echo "hy_s7.sh: MODE=$MODE: expected dev or final" >&2
    exit 2
    ;;
esac
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/hy-s7.tgz" -C "$OUT" hy-s7 2> /dev/null
ls -la "$FILES"
