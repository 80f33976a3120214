#!/usr/bin/env bash
# GV, session 6, calls C and D (issue 19 in the Gluon forward), one command under LIMIT
# seconds (130):
#  (1) `fa-bench run -s tools/gpu/variants_gluon_d.toml -i triton` (the variant cases and
#      their dense causal controls, bf16 32/8 heads d128, the backend naming the kernel;
#      the winners of call B are the defaults) and its targets' table
#      (tools/gpu/variants_gluon_summary.py) into $OUT/summary.md;
#  (2) tools/gpu/variants_gluon.py's development rows (rows 4-10: ALiBi [abs], softcap
#      [plain] (session 5's), [fixed], [fixed, qscale] (the default), + exp2 split 1/4,
#      1/8, 1/2; do_bench, each beside the dense Gluon kernel; no checks: (3) runs them);
#  (3) the GPU tests of the paths new in session 6 (tests/test_flash_gluon_var_alibi.py:
#      causal ALiBi's per-column form against float64) with what is left.
# Everything in $OUT/variants-gluon-c.tgz. From the repository root:
#
#   bash tools/gpu/variants_gluon_c.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-130}
ROWS=${ROWS:-11}
FILES="$OUT/variants-gluon-c"
rm -rf "$FILES" fa-bench-out/variants-gluon-c-run
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1

# (1) the targets through fa-bench run
step "fa-bench run" 60 fa-bench run -s tools/gpu/variants_gluon_d.toml -i triton \
  --max-time 0.3 --no-telemetry -o fa-bench-out/variants-gluon-c-run > "$FILES/run.log" 2>&1
cp fa-bench-out/variants-gluon-c-run/results.json "$FILES/results.json" 2>> "$STEPS"
step "summary" 8 python3 tools/gpu/variants_gluon_summary.py "$FILES/results.json" \
  > "$OUT/summary.md" 2>> "$STEPS"

# (2) the do_bench rows
step "variants_gluon speed" 45 env OUT="$FILES" python3 tools/gpu/variants_gluon.py \
  --dtypes bf16 --budget 40 --row-timeout 15 --rows "$ROWS" --from-row 4 --no-flex \
  --workers 1 --speed-only > "$FILES/variants_gluon.log" 2>&1
cat "$FILES/variants_gluon.md" >> "$OUT/summary.md" 2>> "$STEPS"

# (3) the GPU tests of the new paths
step "gpu tests" 40 python3 -m pytest -q -m gpu -p no:cacheprovider -x \
  -k "bf16 and d128" tests/test_flash_gluon_var_alibi.py > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/variants-gluon-c.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
