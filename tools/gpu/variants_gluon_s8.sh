#!/usr/bin/env bash
# SC, session 8 (issue 19: the variant forward's launch), one command under LIMIT seconds
# (default 90), each step capped (tools/gpu/steps.sh):
#  (1) tools/gpu/variants_gluon_s8.py speed: the three-consumer 64-key launch (c3,
#      flash_gluon_varhost.C3_N64) against the two-consumer 128-key one (c2) and the dense
#      kernel, do_bench, causal d128 32/8 heads, bf16 and fp16: softcap 50 and ALiBi at
#      8 x 8k, a 4k window alone and with softcap 50 at 2 x 32k, the packed 16k tokens
#      (uniform:256-3840) against 8 x 2048, softcap at 2 x 16k; fp16 softcap rows also
#      "c3q" (Q scaled by scale / c once per tile, SOFTCAP_QSCALE_FP16); then the pick
#      (the C3_KINDS those rows say, $OUT/.../variants_gluon_s8_pick.json);
#  (2) the GPU tests of the c3 launch (tests/test_flash_gluon_var_s8_gpu.py, -k $TESTS,
#      default all: every causal d128 variant check on c3 under the accuracy rule, the fp16
#      softcap ones with SOFTCAP_QSCALE_FP16 too, and the committed table's default),
#      verbose so a cut run still shows each result.
# Everything in $OUT/variants-gluon-s8.tgz, the tables also in $OUT/summary.md. From the
# repository root:
#
#   LIMIT=90 bash tools/gpu/variants_gluon_s8.sh
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-90}
SPEED=${SPEED:-}  # "--quick": the first four rows only
SPEED_CAP=${SPEED_CAP:-46}
TESTS=${TESTS:-c3 or default}  # the GPU tests' -k
FILES="$OUT/variants-gluon-s8"
rm -rf "$FILES"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=3 STEP_MIN=8 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
steps_header

# shellcheck disable=SC2086
step "speed" "$SPEED_CAP" env OUT="$FILES" python3 tools/gpu/variants_gluon_s8.py speed $SPEED \
  --budget $((SPEED_CAP - 6)) --workers 12 > "$FILES/speed.log" 2>&1
# the pick from whatever rows the speed step wrote (a cut step leaves the rows so far)
[ -f "$FILES/variants_gluon_s8_speed.json" ] && env OUT="$FILES" python3 \
  tools/gpu/variants_gluon_s8.py pick "$FILES/variants_gluon_s8_speed.json" \
  > "$FILES/pick.log" 2>&1
step "gpu tests" 60 python3 -m pytest -v -rfE -m gpu -n 12 -p no:cacheprovider -k "$TESTS" \
  tests/test_flash_gluon_var_s8_gpu.py > "$FILES/tests.log" 2>&1
tail -3 "$FILES/tests.log" >> "$STEPS"
{
  echo "## c3 (C3_N64) vs c2 vs dense (do_bench)"
  cat "$FILES/variants_gluon_s8_speed.md" 2> /dev/null
  echo "## pick"
  cat "$FILES/pick.log" 2> /dev/null
  echo "## GPU tests"
  grep -E "FAILED|ERROR" "$FILES/tests.log" | head -20
  tail -3 "$FILES/tests.log"
} > "$OUT/summary.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$OUT/summary.md" "$FILES/"
tar -czf "$OUT/variants-gluon-s8.tgz" -C "$FILES" .
cat "$OUT/summary.md" 2> /dev/null | head -60
