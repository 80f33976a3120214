#!/usr/bin/env bash
# SC, session 8, call 2 (issue 19's variant forward, the final measurement), one command
# under LIMIT seconds (default 120), each step capped (tools/gpu/steps.sh):
#  (1) the GPU tests of the committed default (tests/test_flash_gluon_var_s8_gpu.py -k
#      committed: every causal d128 check of a (kind, dtype) C3_KINDS lists, through
#      flash_attention's own choice, the three-consumer launch asserted, accuracy rule);
#  (2) PICK=1 only (call 1's A/B never reached the committed table): the A/B
#      (tools/gpu/variants_gluon_s8.py speed --quick, then pick), and (3) runs the plugin's
#      `triton-pick` (C3_KINDS from that pick) in place of `triton`;
#  (3) fa-bench run of tools/gpu/variants_targets_s7.toml, forward only, bf16 and fp16 in
#      one process, `triton` (FLEX=1: and flex), --max-time 0.3, and the targets' table
#      (each variant ÷ its dense causal control, the backend that ran).
# Everything in $OUT/variants-gluon-s8-final.tgz, the tables in $OUT/summary.md. From the
# repository root:
#
#   LIMIT=120 bash tools/gpu/variants_gluon_s8_final.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-120}
PICK=${PICK:-}
FLEX=${FLEX:-}
FILES="$OUT/variants-gluon-s8-final"
RUN=fa-bench-out/variants-gluon-s8-final
rm -rf "$FILES" "$RUN"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
steps_header
python3 -c "from fa_bench.kernels import flash_gluon_varhost as v; print('C3_KINDS', v.C3_KINDS)" \
  >> "$STEPS" 2>&1

step "gpu tests" 35 python3 -m pytest -v -rfE -m gpu -n 8 -p no:cacheprovider -k committed \
  tests/test_flash_gluon_var_s8_gpu.py > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
IMPL=triton
PLUGIN=()
if [ -n "$PICK" ]; then
  step "speed" 40 env OUT="$FILES" python3 tools/gpu/variants_gluon_s8.py speed --quick \
    --budget 34 --workers 12 > "$FILES/speed.log" 2>&1
  if [ -f "$FILES/variants_gluon_s8_speed.json" ]; then
    env OUT="$FILES" python3 tools/gpu/variants_gluon_s8.py pick \
      "$FILES/variants_gluon_s8_speed.json" > "$FILES/pick.log" 2>&1
    IMPL=triton-pick
    PLUGIN=(--plugin tools/gpu/variants_gluon_s8_plugin.py)
    export VAR_S8_PICK="$FILES/variants_gluon_s8_pick.json"
  fi
fi
IMPLS=(-i "$IMPL")
[ -n "$FLEX" ] && IMPLS+=(-i flex)
step "targets fwd" 75 fa-bench run "${PLUGIN[@]}" -s tools/gpu/variants_targets_s7.toml \
  "${IMPLS[@]}" --mode fwd --dtype bf16,fp16 --max-time 0.3 --no-report -o "$RUN/targets" \
  > "$FILES/targets.log" 2>&1
cp "$RUN/targets/results.json" "$FILES/targets.json" 2>> "$STEPS"
{
  echo "## Forward targets (fa-bench run, variants_targets_s7.toml, $IMPL)"
  python3 tools/gpu/variants_gluon_s8.py targets "$FILES/targets.json" --impl "$IMPL"
  if [ -n "$PICK" ]; then
    echo "## A/B (do_bench) and pick"
    cat "$FILES/variants_gluon_s8_speed.md" "$FILES/pick.log" 2> /dev/null
  fi
  echo "## GPU tests (committed default)"
  grep -E "FAILED|ERROR" "$FILES/tests.log" | head -20
  tail -3 "$FILES/tests.log"
} > "$OUT/summary.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$OUT/summary.md" "$FILES/"
tar -czf "$OUT/variants-gluon-s8-final.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
