#!/usr/bin/env bash
# The variants' backward on the GPU (issue 19, part VB) in one step list, ~3 minutes:
#   (1) tools/gpu/variants_bwd.py: backward TFLOP/s of softcap 50 / ALiBi against dense
#       causal at 8 x 8k, a 4k window against dense causal at 2 x 32k, the packed 16k-token
#       batch (mixed lengths) against 8 x 2048, with the packed table on and off and the
#       dK/dV kernel's DP_FIRST on and off; bitwise checks of each switch;
#   (2) the GPU tests of the packed table and DP_FIRST (tests/test_flash_varlen_sched_gpu.py)
#       and the variants' GPU tests (tests/test_flash_variants_gpu.py), after (1) warmed
#       triton's cache.
# From the repository root:   bash tools/gpu/variants_bwd.sh
# Files under $OUT: variants_bwd.md/.json (the table and ratios), variants-bwd-tests.log,
# variants-bwd-steps.log.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
mkdir -p "$OUT"
LIMIT=${LIMIT:-180} # seconds of wall time for the whole script
STEPS="$OUT/variants-bwd-steps.log"
STEP_RESERVE=5 STEP_MIN=15 STEP_KILL=10
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

git log --oneline -1 >> "$STEPS" 2>&1
step "bench: variants' backward" "${BENCH_S:-100}" python3 tools/gpu/variants_bwd.py \
  > "$OUT/variants_bwd.log" 2>&1
tail -40 "$OUT/variants_bwd.log"
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 4)
step "gpu tests: packed table, variants" 70 python3 -m pytest -q -m gpu -p no:cacheprovider \
  "${XDIST[@]}" tests/test_flash_varlen_sched_gpu.py tests/test_flash_variants_gpu.py \
  > "$OUT/variants-bwd-tests.log" 2>&1
tail -5 "$OUT/variants-bwd-tests.log"
echo "done after ${SECONDS} s" | tee -a "$STEPS"
