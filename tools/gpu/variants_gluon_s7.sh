#!/usr/bin/env bash
# SC, session 7 (issue 19: the softcap forward in the Gluon variant kernel), one command
# under LIMIT seconds (default 90), each step capped (tools/gpu/steps.sh):
#  (1) tools/gpu/variants_gluon_s7.py mufu: MUFU.TANH's and MUFU.EX2's results per clock
#      per SM (FFMA = 128 as the yardstick): does tanh run at ex2's rate?
#  (2) tools/gpu/variants_gluon_s7.py speed: the candidates (the packed bf16 row sums, no
#      ping-pong, both, ring depth 2, 64-key blocks) beside the default and the dense
#      kernel, do_bench, softcap 50 causal at 8 x 8k and 2 x 16k, with and without a 4k
#      window;
#  (3) the GPU tests of the packed row sums (tests/test_flash_gluon_var_s7.py, -k $TESTS,
#      default bf16: the accuracy rule on every bf16 softcap check with the switch on);
#  (4) fa-bench run of tools/gpu/variants_gluon_s7.toml: `triton` (the default) beside the
#      session's candidates as plugin implementations (CANDS, default "triton-sum"), the
#      softcap cases and their dense controls, and the targets' table.
# Everything in $OUT/variants-gluon-s7.tgz, the tables also in $OUT/summary.md. From the
# repository root:
#
#   LIMIT=90 bash tools/gpu/variants_gluon_s7.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-90}
CANDS=${CANDS:-triton-sum}
SPEED=${SPEED:-}  # "--quick": 8 x 8k without a window only
TESTS=${TESTS:-bf16}  # the GPU tests' -k ("bf16 or fp16": all; fp16 takes no packed sum)
FILES="$OUT/variants-gluon-s7"
RUN=fa-bench-out/variants-gluon-s7-run
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

step "mufu" 12 env OUT="$FILES" python3 tools/gpu/variants_gluon_s7.py mufu \
  > "$FILES/mufu.log" 2>&1
step "speed" 36 env OUT="$FILES" python3 tools/gpu/variants_gluon_s7.py speed $SPEED \
  --budget 31 > "$FILES/speed.log" 2>&1
step "gpu tests" 28 python3 -m pytest -q -rfE -m gpu -n 4 -p no:cacheprovider -k "$TESTS" \
  tests/test_flash_gluon_var_s7.py > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
IMPLS="-i triton"
for c in ${CANDS//,/ }; do IMPLS="$IMPLS -i $c"; done
# shellcheck disable=SC2086
step "fa-bench run" 24 fa-bench run --plugin tools/gpu/variants_gluon_s7_plugin.py \
  -s tools/gpu/variants_gluon_s7.toml $IMPLS --max-time 0.3 --no-report -o "$RUN" \
  > "$FILES/run.log" 2>&1
cp "$RUN/results.json" "$FILES/results.json" 2>> "$STEPS"
{
  echo "## MUFU rates"
  cat "$FILES/variants_gluon_s7_mufu.md"
  echo "## Candidates (do_bench)"
  cat "$FILES/variants_gluon_s7_speed.md"
  echo "## GPU tests"
  tail -3 "$FILES/tests.log"
  echo "## fa-bench run"
  python3 tools/gpu/variants_gluon_s7.py summary "$FILES/results.json"
} > "$OUT/summary.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$OUT/summary.md" "$FILES/"
tar -czf "$OUT/variants-gluon-s7.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -80
