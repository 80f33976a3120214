#!/usr/bin/env bash
# Issue 21's forward rows at one head_dim: the Gluon GPU accuracy tests there, then
# `fa-bench run` of triton beside sdpa-cudnn (bf16 and fp16, causal both) and
# tools/gpu/issue21_summary.py's table. From the repository root, after the device prefix:
#
#   HEAD_DIM=128 SEQLEN=1024,2048,4096,16384 bash tools/gpu/fwd_final.sh   # under $OUT
#
# Each step has its own cap; a failing step never stops the next.
set -u
OUT=${OUT:-fa-bench-out/out}
HEAD_DIM=${HEAD_DIM:-128}
SEQLEN=${SEQLEN:-4096,16384}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off

step() {
  local name=$1 cap=$2 t0=$SECONDS
  shift 2
  echo "[$(date -u +%T)] $name: start (cap $cap s)" | tee -a "$OUT/steps.log"
  timeout -s TERM -k 10 "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "[$(date -u +%T)] $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
}

step tests "${TEST_CAP:-60}" pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_flash_gluon.py \
  -k "test_gpu_every_candidate_config or (test_gpu_forward_accuracy and -$HEAD_DIM-)"
step run "${RUN_CAP:-110}" fa-bench run -s standard --mode fwd -i triton -i sdpa-cudnn \
  --head-dim "$HEAD_DIM" --seqlen "$SEQLEN" --max-time 0.5 --no-report --tuning-cache off \
  -o "$OUT/run"
python tools/gpu/issue21_summary.py "$OUT/run" > "$OUT/summary.md" 2>&1
tail -3 "$OUT/tests.log"
cat "$OUT/summary.md"
