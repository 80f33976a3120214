#!/usr/bin/env bash
# One H200 call (2026-11-30, session 4, last call): each issue's check in one go, under
# deadlines, from the repository root after the device prefix of device-prep.sh:
#   bash tools/gpu/session4c.sh
# 1. issue 19: tools/gpu/variants_check.sh (our kernel's variants: gpu tests, fa-bench runs)
# 2. issue 20: tools/gpu/decode_check.sh (the decode plan's gpu tests, flush A/B, fa-bench run)
# 3. issue 21: the forward dispatch's gpu tests, then `fa-bench run -s standard --mode fwd`
#    of triton (Gluon where dispatched) and sdpa-cudnn at 4k and 16k, bf16 and fp16
# 4. issue 21: tools/gpu/fp8_check.sh (the fp8 forward's gpu tests and run)
# Everything under $OUT is packed into $OUT/session4c.tgz at the end (the device tool
# returns few files); summaries are also printed.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
mkdir -p "$OUT/c" fa-bench-out/i21
C=$OUT/c
t0=$SECONDS
LIMIT=${K_LIMIT:-165} OUT=$C bash tools/gpu/variants_check.sh > "$C/K-console.log" 2>&1
echo "K: exit $? after $((SECONDS - t0)) s"
t0=$SECONDS
LIMIT=${D_LIMIT:-110} OUT=$C bash tools/gpu/decode_check.sh > "$C/D-console.log" 2>&1
echo "D: exit $? after $((SECONDS - t0)) s"
t0=$SECONDS
timeout -s TERM 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_flash_dispatch.py \
  > "$C/i21-tests.log" 2>&1
echo "i21 tests: exit $?; $(tail -1 "$C/i21-tests.log")"
timeout -s TERM -k 10 "${I21_LIMIT:-110}" fa-bench run -s standard --mode fwd -i triton \
  -i sdpa-cudnn --seqlen 4096,16384 --max-time 0.5 --no-report --tuning-cache off \
  --out fa-bench-out/i21 > "$C/i21-run.log" 2>&1
echo "i21 run: exit $? after $((SECONDS - t0)) s"
cp fa-bench-out/i21/results.json "$C/i21-results.json" 2>/dev/null
python3 tools/gpu/issue21_summary.py fa-bench-out/i21 > "$C/i21.md" 2>&1
cat "$C/i21.md"
t0=$SECONDS
LIMIT=${F_LIMIT:-60} OUT=$C bash tools/gpu/fp8_check.sh > "$C/F-console.log" 2>&1
echo "F: exit $? after $((SECONDS - t0)) s"
tar -czf "$OUT/session4c.tgz" -C "$OUT" c -C "$PWD" fa-bench-out 2>/dev/null
ls -la "$OUT"
