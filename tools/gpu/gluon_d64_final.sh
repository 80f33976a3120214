#!/usr/bin/env bash
# Issue 21 part 1 (the Gluon forward at head_dim 64), session 5's last GPU call: check the
# heuristic's launch at d64 (three consumers over 128-key steps, non-causal since call C)
# and measure it in `fa-bench run` beside sdpa-cudnn. About 2.5 minutes; from the
# repository root:
#
#   bash tools/gpu/gluon_d64_final.sh          # writes under $OUT
#
# 1. tests: the Gluon GPU accuracy tests at head_dim 64 (every GPU_SHAPES shape: GQA, odd
#    lengths, Sq != Sk both ways with rows without keys, length 1, a (B, S, H, D) input;
#    bf16/fp16, causal both; the heuristic's launch) and this part's split launches,
#    8 workers (the compiles run in parallel);
# 2. d64: tools/gpu/gluon_d64.py at d64 non-causal, the heuristic against the previous
#    two-consumer launch and cuDNN (do_bench, 100 ms windows), checks first;
# 3. run: `fa-bench run` at head_dim 64, 4k and 16k, causal both, bf16 and fp16, triton
#    and sdpa-cudnn, then tools/gpu/issue21_summary.py's table into $OUT/summary.md.
# Each step has its own cap; a failing step never stops the next.
set -u
OUT=${OUT:-fa-bench-out/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off

step() {
  local name=$1 cap=$2 t0=$SECONDS
  shift 2
  echo "[$(date -u +%T)] $name: start (cap $cap s)" | tee -a "$OUT/steps.log"
  timeout -s TERM -k 10 "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "[$(date -u +%T)] $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
}

step tests 50 pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_gluon_exp2.py \
  tests/test_flash_gluon.py -k "test_split_launches or (test_gpu_forward_accuracy and -64-)"
step d64 35 env OUT="$OUT/d64" python tools/gpu/gluon_d64.py --budget 25 --rep 100 \
  --only 0,1 --roles ws,pq2
step run 70 fa-bench run -s standard --mode fwd -i triton -i sdpa-cudnn --head-dim 64 \
  --seqlen 4096,16384 --max-time 0.5 --no-report --tuning-cache off -o "$OUT/run"
python tools/gpu/issue21_summary.py "$OUT/run" > "$OUT/summary.md" 2>&1
tail -3 "$OUT/tests.log"
cat "$OUT/summary.md"
