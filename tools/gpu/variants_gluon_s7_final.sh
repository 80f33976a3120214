#!/usr/bin/env bash
# SC, session 7, call 2 (issue 19's softcap forward, the final measurement), one command
# under LIMIT seconds (default 85), each step capped (tools/gpu/steps.sh):
#  (1) fa-bench run of tools/gpu/variants_gluon_d.toml, `triton` only (issue 19's forward
#      targets: window 4k 2 x 32k, softcap 50 and ALiBi 8 x 8k, packed 16k tokens, each
#      beside its dense causal control) with the session's default, and its targets' table
#      (tools/gpu/variants_gluon_summary.py);
#  (2) the softcap pair again beside the plugin's implementations in $AB (default
#      `triton-sum`, the packed row sums; `triton-s6`: session 6's softcap) in one run of
#      tools/gpu/variants_gluon_s7.toml, with clocks and energy per call;
#  (3) the GPU tests of the softcap paths (tests/test_flash_gluon_var_s7.py, bf16 and
#      fp16, then the fixed-offset ones of tests/test_flash_gluon_var_alibi.py).
# Everything in $OUT/variants-gluon-s7-final.tgz, the tables in $OUT/summary.md. From the
# repository root:
#
#   LIMIT=85 bash tools/gpu/variants_gluon_s7_final.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-85}
AB=${AB:-triton-sum}  # the plugin's implementations timed beside `triton` in (2)
FILES="$OUT/variants-gluon-s7-final"
RUN=fa-bench-out/variants-gluon-s7-final
rm -rf "$FILES" "$RUN"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1

step "targets" 40 fa-bench run -s tools/gpu/variants_gluon_d.toml -i triton --max-time 0.3 \
  --no-report -o "$RUN/targets" > "$FILES/targets.log" 2>&1
cp "$RUN/targets/results.json" "$FILES/targets.json" 2>> "$STEPS"
IMPLS="-i triton"
for c in ${AB//,/ }; do IMPLS="$IMPLS -i $c"; done
# shellcheck disable=SC2086
step "ab" 24 fa-bench run --plugin tools/gpu/variants_gluon_s7_plugin.py \
  -s tools/gpu/variants_gluon_s7.toml $IMPLS --max-time 0.3 --no-report \
  -o "$RUN/ab" > "$FILES/ab.log" 2>&1
cp "$RUN/ab/results.json" "$FILES/ab.json" 2>> "$STEPS"
step "gpu tests" 30 python3 -m pytest -q -rfE -m gpu -n 4 -p no:cacheprovider \
  tests/test_flash_gluon_var_s7.py tests/test_flash_gluon_var_alibi.py -k "s7 or softcap_fixed" \
  > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
{
  echo "## Targets (fa-bench run, variants_gluon_d.toml)"
  python3 tools/gpu/variants_gluon_summary.py "$FILES/targets.json"
  echo "## Softcap beside $AB (one fa-bench run)"
  python3 tools/gpu/variants_gluon_s7.py summary "$FILES/ab.json"
  echo "## GPU tests"
  tail -3 "$FILES/tests.log"
} > "$OUT/summary.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$OUT/summary.md" "$FILES/"
tar -czf "$OUT/variants-gluon-s7-final.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
