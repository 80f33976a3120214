#!/usr/bin/env bash
# The variants' backward on the GPU (issue 19, part VB) in one step list, ~2.5-3 minutes:
#   (1) tools/gpu/variants_bwd.py: backward TFLOP/s of softcap 50 / ALiBi against dense
#       causal at 8 x 8k, a 4k window against dense causal at 2 x 32k, the packed 16k-token
#       batch (mixed lengths) against 8 x 2048, with the development switches both ways
#       and bitwise checks of each;
#   (2) TESTS=1 (default): the GPU tests of the packed table and DP_FIRST
#       (tests/test_flash_varlen_sched_gpu.py) and the variants' GPU tests
#       (tests/test_flash_variants_gpu.py), after (1) warmed triton's cache;
#   (3) RUN=1: the issue's numbers through `fa-bench run -s variants --mode bwd`
#       (tools/gpu/variants_check.sh with TESTS=0 BENCH=0 MODES=bwd: softcap 0/50 and
#       ALiBi at 8 x 8k with triton, the packed 16k tokens mixed vs equal, the 4k window at
#       2 x 32k with triton and flex, then flex's softcap 50 and ALiBi cases) and their
#       summary, $OUT/variants.md.
# PACKED=1: the packed batch only (session 6, the packed dK/dV kernel's clamped loads):
#   (1) on the packed rows (8 x 2048 dense, packed equal and mixed, clamped and masked
#   loads), (2) the packed GPU tests only (tests/test_flash_varlen_sched_gpu.py,
#   tests/test_flash_varlen_clamp_gpu.py), (3) the packed run and its dense control only.
# From the repository root:   bash tools/gpu/variants_bwd.sh
#   final call:               TESTS=0 RUN=1 LIMIT=165 bash tools/gpu/variants_bwd.sh
#   packed, ~80 s:            PACKED=1 LIMIT=80 bash tools/gpu/variants_bwd.sh
#   packed, fa-bench run:     PACKED=1 BENCH=0 TESTS=0 RUN=1 LIMIT=80 bash tools/gpu/variants_bwd.sh
#   final (RUN_FIRST: the run, the tests, then the bench's rows; VB_NAMES: ';'-separated
#   case names):
#     PACKED=1 RUN=1 RUN_FIRST=1 RUN_S=40 TESTS_S=30 VB_NAMES="..." LIMIT=88 \
#       bash tools/gpu/variants_bwd.sh
# Files under $OUT: variants_bwd.md/.json (the table and ratios), variants-bwd-tests.log,
# variants-bwd-steps.log; with RUN=1 variants.md, variants-results-*.json, variants-run-*.log.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
mkdir -p "$OUT"
LIMIT=${LIMIT:-180} # seconds of wall time for the whole script
TESTS=${TESTS:-1} RUN=${RUN:-0} PACKED=${PACKED:-0} BENCH=${BENCH:-1} RUN_FIRST=${RUN_FIRST:-0}
export PACKED
STEPS="$OUT/variants-bwd-steps.log"
STEP_RESERVE=5 STEP_MIN=15 STEP_KILL=10
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

run_packed() { # the packed mixed batch and its 8 x 2048 control, backward, fa-bench run
  local work
  work=fa-bench-out/variants-bwd/$(date -u +%H%M%S)
  mkdir -p "$work"
  step "run packed" "$1" fa-bench run -s variants --dtype bf16 --head-dim 128 \
    --mode bwd --no-report --max-time "${MAXT:-0.4}" --tuning-cache off --impl triton \
    --seqlen 2048 --batch 8 --window none --softcap 0 --no-alibi \
    --varlen uniform:256-3840 --varlen none --out "$work/packed" \
    > "$OUT/variants-run-packed.log" 2>&1
  cp "$work/packed/results.json" "$OUT/variants-results-packed.json" 2>> "$STEPS"
  python3 tools/gpu/variants_summary.py "$OUT/variants-results-packed.json" \
    > "$OUT/variants.md" 2>&1
  tail -30 "$OUT/variants.md"
}

git log --oneline -1 >> "$STEPS" 2>&1
# RUN_FIRST=1 (PACKED=1 RUN=1): the fa-bench run before the bench and the tests
if [ "$RUN" = 1 ] && [ "$PACKED" = 1 ] && [ "$RUN_FIRST" = 1 ]; then
  run_packed "${RUN_S:-45}"
fi
bench() {
  step "bench: variants' backward" "${BENCH_S:-60}" python3 tools/gpu/variants_bwd.py \
    > "$OUT/variants_bwd.log" 2>&1
  tail -40 "$OUT/variants_bwd.log"
}
# RUN_FIRST=1: the GPU tests before the bench too (the bench's rows last)
if [ "$BENCH" = 1 ] && [ "$RUN_FIRST" = 0 ]; then
  bench
fi
if [ "$TESTS" = 1 ] && [ "$PACKED" = 1 ]; then
  XDIST=()
  python3 -c "import xdist" 2> /dev/null && XDIST=(-n 4)
  step "gpu tests: packed" "${TESTS_S:-60}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    "${XDIST[@]}" tests/test_flash_varlen_clamp_gpu.py tests/test_flash_varlen_sched_gpu.py \
    > "$OUT/variants-bwd-tests.log" 2>&1
  tail -5 "$OUT/variants-bwd-tests.log"
elif [ "$TESTS" = 1 ]; then
  XDIST=()
  python3 -c "import xdist" 2> /dev/null && XDIST=(-n 4)
  step "gpu tests: packed table, variants" 70 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "${XDIST[@]}" tests/test_flash_varlen_sched_gpu.py tests/test_flash_variants_gpu.py \
    > "$OUT/variants-bwd-tests.log" 2>&1
  tail -5 "$OUT/variants-bwd-tests.log"
fi
if [ "$BENCH" = 1 ] && [ "$RUN_FIRST" = 1 ]; then
  bench
fi
if [ "$RUN" = 1 ] && [ "$PACKED" = 1 ] && [ "$RUN_FIRST" = 0 ]; then
  run_packed "$(($(left) - 8))"
elif [ "$RUN" = 1 ] && [ "$PACKED" = 0 ]; then
  echo "[$(date -u +%T) +${SECONDS}s] fa-bench run (variants_check.sh)" | tee -a "$STEPS"
  TESTS=0 BENCH=0 MODES=bwd IMPLS=${IMPLS:-triton,flex} MOD_IMPLS=${MOD_IMPLS:-triton} \
    FLEX_LAST=${FLEX_LAST:-1} LIMIT=$(($(left) - 3)) \
    bash "$(dirname "$0")/variants_check.sh" > "$OUT/variants-check.log" 2>&1
  tail -30 "$OUT/variants.md" 2> /dev/null
fi
echo "done after ${SECONDS} s" | tee -a "$STEPS"
# one archive of everything above, for the lead's copy back
tar -czf "$OUT/variants-bwd.tgz" -C "$OUT" --exclude variants-bwd.tgz . 2> /dev/null
