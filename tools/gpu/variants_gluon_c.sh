#!/usr/bin/env bash
# GV, session 6, calls C and D (issue 19 in the Gluon forward), one command under LIMIT
# seconds (130):
#  (1) `fa-bench run -s tools/gpu/variants_gluon_d.toml -i triton` (the variant cases and
#      their dense causal controls, bf16 32/8 heads d128, the backend naming the kernel;
#      the winners of call B are the defaults) and its targets' table
#      (tools/gpu/variants_gluon_summary.py) into $OUT/summary.md;
#  (2) tools/gpu/variants_gluon.py's development rows (rows 4-8: ALiBi [abs], softcap
#      [plain] (session 5's), [fixed], [fixed, qscale] (the default), [fixed, qscale,
#      tree]; do_bench, each beside the dense Gluon kernel; no checks: (3) runs them);
#  (3) the GPU tests of the paths new in session 6 (tests/test_flash_gluon_var_alibi.py,
#      bf16 d128: the softcap's fixed offset, then causal ALiBi's column form, each
#      against float64 under the accuracy rule) with what is left.
# Everything in $OUT/variants-gluon-c.tgz. From the repository root:
#
#   bash tools/gpu/variants_gluon_c.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-130}
ROWS=${ROWS:-9}
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

# (2) the do_bench rows 4-8 (ALiBi [abs], softcap [plain], [fixed], [fixed, qscale] (the
# default), [fixed, qscale, tree]; call C timed the exp2 splits: no gain)
step "variants_gluon speed" 35 env OUT="$FILES" python3 tools/gpu/variants_gluon.py \
  --dtypes bf16 --budget 30 --row-timeout 12 --rows "$ROWS" --from-row 4 --no-flex \
  --workers 1 --speed-only > "$FILES/variants_gluon.log" 2>&1
cat "$FILES/variants_gluon.md" >> "$OUT/summary.md" 2>> "$STEPS"

# (3) the GPU tests of the new paths: the softcap's fixed offset first (call C ran the
# ALiBi ones and 3 of the 4 softcap ones before its cap), then ALiBi's column form
step "gpu tests softcap" 40 python3 -m pytest -q -m gpu -p no:cacheprovider \
  -k "bf16 and d128 and softcap_fixed" tests/test_flash_gluon_var_alibi.py \
  > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
step "gpu tests alibi" 50 python3 -m pytest -q -m gpu -p no:cacheprovider \
  -k "bf16 and d128 and column_alibi" tests/test_flash_gluon_var_alibi.py \
  > "$FILES/tests_alibi.log" 2>&1
tail -3 "$FILES/tests_alibi.log" >> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/variants-gluon-c.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
