#!/usr/bin/env bash
# Issue 21 item 3 (the fp8 e4m3 forward) in one device call, under LIMIT seconds (180):
# (a) the fp8 kernel's GPU tests (accuracy rule, lse, GQA, odd lengths, rows with no key,
# head_dim 64/96/128, 16k); (b) `fa-bench run` forward, head_dim 128 and 64, N 4k and 16k,
# causal and not, fp8_e4m3 and bf16, `triton` and `sdpa-cudnn` (whose fp8 cases record
# `unsupported`); (c) a summary, $OUT/fp8.md: fp8 ÷ bf16 per shape (target ≥ 1.3× at
# head_dim 128) and every case's accuracy; (d) with the time left, an A/B of the fp8
# kernel's tiles, descriptors (TMA), warp specialisation and V layout with do_bench
# ($OUT/fp8_bench.md, written shape by shape, d128 first).
#
# From the repository root, after the device prefix (it installs fa-bench editable):
#
#   bash tools/gpu/fp8_check.sh
#
# Every step runs under a deadline and logs its exit code; a failing step does not stop
# the next. Files back under $OUT: fp8-steps.log, fp8-tests.log, fp8-run.log,
# fp8-results.json, fp8.md, fp8_bench.md, fp8_bench.json.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
WORK=fa-bench-out/fp8
mkdir -p "$OUT" "$WORK"
LIMIT=${LIMIT:-180}
SEQLENS=${SEQLENS:-4096,16384} HEAD_DIMS=${HEAD_DIMS:-128,64}
read -r -a DEV <<< "${DEV:-}"
STEPS="$OUT/fp8-steps.log"

left() { echo $((LIMIT - SECONDS)); }
# step NAME CAP_S COMMAND...: run COMMAND under min(CAP_S, time left - reserve) and log it
step() {
  local name=$1 cap=$2 budget
  shift 2
  budget=$(($(left) - 10))
  [ "$budget" -gt "$cap" ] && budget=$cap
  if [ "$budget" -lt 15 ]; then
    echo "[$(date -u +%T) +${SECONDS}s] $name: skipped (time left $(left) s)" | tee -a "$STEPS"
    return 0
  fi
  echo "[$(date -u +%T) +${SECONDS}s] $name: start (limit ${budget} s)" | tee -a "$STEPS"
  timeout -s TERM -k 10 "$budget" "$@"
  local rc=$?
  echo "[$(date -u +%T) +${SECONDS}s] $name: exit $rc" | tee -a "$STEPS"
  return 0
}

{
  git log --oneline -1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1
if ! python3 -c "import fa_bench.kernels.flash_fp8" 2>> "$STEPS"; then
  echo "fa-bench from this tree is not installed: installing it editable" | tee -a "$STEPS"
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl \
    && export PYTHONPATH=$PWD/.site
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$STEPS" 2>&1
fi

# (a) correctness on the GPU
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 4)
step "gpu tests: test_fp8_kernel.py" 50 \
  python3 -m pytest -q -m gpu -p no:cacheprovider "${XDIST[@]}" tests/test_fp8_kernel.py \
  > "$OUT/fp8-tests.log" 2>&1
grep -E "passed|failed|error" "$OUT/fp8-tests.log" | tail -3 >> "$STEPS"

# (b) the standard suite's forward: ours in fp8 and bf16, cuDNN in bf16 for scale
step "run fp8_e4m3,bf16" 65 fa-bench run -s standard --mode fwd --dtype fp8_e4m3,bf16 \
  -i triton -i sdpa-cudnn --head-dim "$HEAD_DIMS" --seqlen "$SEQLENS" \
  --tuning-cache off --no-report --no-telemetry --max-time 0.3 --min-samples 5 --warmup 100 "${DEV[@]}" \
  --out "$WORK/run" > "$OUT/fp8-run.log" 2>&1
cp "$WORK/run/results.json" "$OUT/fp8-results.json" 2>> "$STEPS"

# (c) the summary
step "summary" 15 python3 tools/gpu/fp8_summary.py "$WORK/run/results.json" "$OUT/fp8.md" \
  >> "$STEPS" 2>&1

# (d) tiles and V layout, if time is left
step "fp8 A/B (do_bench)" 200 python3 tools/gpu/fp8_bench.py "$OUT/fp8_bench.md" \
  --json "$OUT/fp8_bench.json" --head-dims "${BENCH_HEAD_DIMS:-128,64}" >> "$STEPS" 2>&1
echo "[$(date -u +%T) +${SECONDS}s] done" | tee -a "$STEPS"
