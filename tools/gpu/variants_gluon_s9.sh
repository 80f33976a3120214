#!/usr/bin/env bash
# SC, session 9 (issue 19: the fp16 softcap's threshold rescale, the LAZY bit behind
# flash_gluon_varhost.SOFTCAP_LAZY_FP16), one command under LIMIT seconds (default 105),
# each step capped (tools/gpu/steps.sh):
#  (1) the GPU tests with the switch on, both forms (tests/test_flash_gluon_var_s9_gpu.py,
#      -k $TESTS, default all: the fp16 softcap checks of variants_gluon_checks.py, rows
#      whose maxima rise late (a large logit at the row's end, a ramp, one row of a tile) on
#      the two- and three-consumer launches, odd lengths, GQA), verbose so a cut run still
#      shows each;
#  (2) tools/gpu/variants_gluon_s9.py: do_bench of fp16 softcap 50 causal d128 32/8 heads
#      at 8 x 8k and 2 x 32k: c2 / c2l / c2w (two consumers without the switch, with it,
#      with its per-warp form SOFTCAP_LAZY_WARP) and c3 / c3l / c3w (C3_N64, the committed
#      launch), beside the dense kernel;
#  (3) fa-bench run of tools/gpu/variants_targets_s7.toml, forward, fp16, `triton`, with
#      $FA_BENCH_SOFTCAP_LAZY set at import to the form (2) found faster on C3_N64 ("1" or
#      "warp"; $FORM overrides), and the targets' table.
# Everything in $OUT/variants-gluon-s9.tgz, the tables in $OUT/summary.md. From the
# repository root:
#
#   LIMIT=105 bash tools/gpu/variants_gluon_s9.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-105}
TESTS=${TESTS:-lazy}  # the GPU tests' -k
SPEED_CAP=${SPEED_CAP:-30}
FILES="$OUT/variants-gluon-s9"
RUN=fa-bench-out/variants-gluon-s9
rm -rf "$FILES" "$RUN"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
steps_header

step "gpu tests" 38 python3 -m pytest -v -rfE -m gpu -n 12 -p no:cacheprovider -k "$TESTS" \
  tests/test_flash_gluon_var_s9_gpu.py > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
step "speed" "$SPEED_CAP" env OUT="$FILES" python3 tools/gpu/variants_gluon_s9.py \
  --budget $((SPEED_CAP - 6)) --workers 8 > "$FILES/speed.log" 2>&1
# the form the A/B found faster on C3_N64 ("warp" when the A/B left no rows)
FORM=${FORM:-$(python3 tools/gpu/variants_gluon_s9.py --best "$FILES/variants_gluon_s9_speed.json")}
echo "FA_BENCH_SOFTCAP_LAZY=$FORM" >> "$STEPS"
step "targets fwd fp16 lazy" 30 env FA_BENCH_SOFTCAP_LAZY="$FORM" fa-bench run \
  -s tools/gpu/variants_targets_s7.toml -i triton --mode fwd --dtype fp16 --max-time 0.3 \
  --no-report -o "$RUN/targets" > "$FILES/targets.log" 2>&1
cp "$RUN/targets/results.json" "$FILES/targets.json" 2>> "$STEPS"
{
  echo "## GPU tests (SOFTCAP_LAZY_FP16 on)"
  grep -E "FAILED|ERROR" "$FILES/tests.log" | head -20
  tail -3 "$FILES/tests.log"
  echo "## fp16 softcap 50: c2 / c2l / c2w / c3 / c3l / c3w vs dense (do_bench)"
  cat "$FILES/variants_gluon_s9_speed.md" 2> /dev/null
  grep -E "^c[23][lw] ÷" "$FILES/speed.log"
  echo "## Forward targets, fp16 (fa-bench run, variants_targets_s7.toml, FA_BENCH_SOFTCAP_LAZY=$FORM)"
  python3 tools/gpu/variants_gluon_s8.py targets "$FILES/targets.json" --impl triton
} > "$OUT/summary.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$OUT/summary.md" "$FILES/"
tar -czf "$OUT/variants-gluon-s9.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
