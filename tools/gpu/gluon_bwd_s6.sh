#!/usr/bin/env bash
# Issue 18 (session 6), calls C and D: the Gluon backward with the launch call B measured
# best, checked then measured through `fa-bench run`, one device call under LIMIT seconds
# (90):
#  (1) the GPU tests of that launch (tests/test_flash_gluon_bwd_s6.py, pytest -k TESTS_K:
#      each role against the float64 reference with the accuracy rule on every (batch,
#      kv head) slice, causal both, GQA 4:1 at 4097, Sq != Sk both ways, a (B, S, H, D)
#      layout with GQA 2:1);
#  (2) tools/gpu/gluon_bwd_run.py: `fa-bench run -s standard --mode bwd` at 4k and 16k,
#      bf16, IMPLS (triton-onepass = the Gluon backward, sdpa-cudnn; `triton` the
#      two-kernel one when time allows), with $FA_BENCH_GLUON_BWD_ROLE=$ROLE (empty: the
#      heuristic as committed), and its table (TFLOP/s, ÷ sdpa-cudnn, the launch each
#      case ran in its backend string).
# From the repository root:
#
#   ROLE=ws-dqfirst TESTS_K=dqfirst bash tools/gpu/gluon_bwd_s6.sh
#
# Everything in $OUT/gluon-bwd-s6.tgz (gluon_bwd_run.md is the table).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-90}
ROLE=${ROLE:-}
TESTS_K=${TESTS_K:-}
IMPLS=${IMPLS:-triton-onepass,sdpa-cudnn}
DTYPES=${DTYPES:-bf16}
MAX_TIME=${MAX_TIME:-0.3}
FILES="$OUT/gluon-bwd-s6"
rm -rf "$FILES"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=4 STEP_MIN=10 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "ROLE=$ROLE TESTS_K=$TESTS_K IMPLS=$IMPLS DTYPES=$DTYPES"
} >> "$STEPS" 2>&1

if [ -n "$TESTS_K" ]; then
  step "gpu tests" 30 python3 -m pytest -q -m gpu -p no:cacheprovider -k "$TESTS_K" \
    tests/test_flash_gluon_bwd_s6.py > "$FILES/tests.log" 2>&1
  tail -3 "$FILES/tests.log" >> "$STEPS"
fi
BUDGET=$(($(left) - 8))
step "fa-bench run bwd" "$BUDGET" env OUT="$FILES" FA_BENCH_GLUON_BWD_ROLE="$ROLE" \
  python3 tools/gpu/gluon_bwd_run.py --dtypes "$DTYPES" --impls "$IMPLS" \
  --budget "$((BUDGET - 3))" --max-time "$MAX_TIME" > "$FILES/run.log" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$FILES/gluon_bwd_run.md" "$OUT/" 2> /dev/null
tar -czf "$OUT/gluon-bwd-s6.tgz" -C "$FILES" .
