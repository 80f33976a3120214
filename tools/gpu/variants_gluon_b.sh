#!/usr/bin/env bash
# GV, session 6 (issue 19 in the Gluon forward: ALiBi and softcap speed), one command
# under LIMIT seconds (100):
#  (1) tools/gpu/variants_gluon.py, bf16: every variant check against float64 under the
#      accuracy rule (causal ALiBi now takes the per-column bias, ALIBI_COL, by default),
#      and the softcap checks again with FIXED_MAX (a fixed offset in place of the row
#      max) alone and with QSCALE; then do_bench TFLOP/s (bf16, 32/8 heads, d128,
#      causal) of the four target rows beside the dense Gluon kernel and our `tl`
#      kernel, then ALiBi in session 5's |.| form ([abs]) and softcap [fixed],
#      [fixed, qscale], [fixed, qscale, emu 4|8], each beside the dense kernel timed in
#      the same row;
#  (2) the table (variants_gluon.md) into $OUT/summary.md.
# Everything in $OUT/variants-gluon-b.tgz. From the repository root:
#
#   bash tools/gpu/variants_gluon_b.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-100}
FILES="$OUT/variants-gluon-b"
rm -rf "$FILES"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1

# (1) checks (55% of the budget) and the 9 speed rows (the targets, [abs], [fixed],
# [fixed, qscale], [fixed, qscale, emu 4], [..., emu 8]); flex is left out (its compiles cost the budget; session 5 timed it)
step "variants_gluon" 92 env OUT="$FILES" python3 tools/gpu/variants_gluon.py \
  --dtypes bf16 --budget 80 --row-timeout 20 --rows 9 --no-flex \
  --dev "fixed,fixed qscale" > "$FILES/variants_gluon.log" 2>&1
cp "$FILES/variants_gluon.md" "$OUT/summary.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/variants-gluon-b.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
