#!/usr/bin/env bash
# One H200 call (2026-11-30, session 5, first call): verify what changed after session 4's
# last GPU call and measure what the next steps need, from the repository root after the
# device prefix of device-prep.sh:   bash tools/gpu/session5a.sh
# 1. the GPU tests of the Gluon sweep, variants, dispatch, fp8 and decode plan;
# 2. `fa-bench sweep --kernel gluon` at the forward shapes still behind cuDNN (4k non-causal,
#    head_dim 64 and 128, bf16);
# 3. tools/gpu/variants_bench.py (softcap/ALiBi with the dense tile, the packed backward);
# 4. tools/gpu/gluon_check.py --light over the Gluon roles never timed.
# Everything under $OUT is packed into $OUT/session5a.tgz.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
LIMIT=${LIMIT:-450}
A=$OUT/a
mkdir -p "$A"
STEPS=$A/steps.log
# shellcheck source=tools/gpu/steps.sh
source tools/gpu/steps.sh
step tests 110 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_sweep_gluon.py \
  tests/test_flash_variants_gpu.py tests/test_flash_dispatch.py tests/test_fp8_kernel.py \
  tests/test_decode_kernel_plan.py > "$A/tests.log" 2>&1
tail -3 "$A/tests.log"
step sweep 120 fa-bench sweep -s standard --kernel gluon --mode fwd --dtype bf16 \
  --head-dim 64,128 --seqlen 4096 --no-causal --max-time 0.3 --budget-minutes 1.8 \
  --out "$A/sweep" > "$A/sweep.log" 2>&1
tail -30 "$A/sweep.log"
step variants 75 python3 tools/gpu/variants_bench.py > "$A/variants_bench.md" 2> "$A/variants_bench.err"
cat "$A/variants_bench.md"
OUT=$A step gluon 130 python3 tools/gpu/gluon_check.py --light \
  --roles ws-persist-q2,ws-persist,ws-c3,ws-nopp,ws-shallow > "$A/gluon.log" 2>&1
tail -40 "$A/gluon.log"
tar -czf "$OUT/session5a.tgz" -C "$OUT" a 2>/dev/null
ls -la "$OUT"
