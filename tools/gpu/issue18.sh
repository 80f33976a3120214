#!/usr/bin/env bash
# Issue 18's GPU check in one device call (one H200, under 9 minutes): the one-pass
# backward's and the two-kernel backward's GPU tests, the standard suite's backward at
# 4k and 16k for triton (two-kernel) / triton-onepass / sdpa-cudnn, a short sweep of
# `triton`'s backward tiles, an A/B of the one-pass dQ adds (pointer atomics vs the TMA
# reduce-add), a summary
# (TFLOP/s and the ratio to sdpa-cudnn), then, if time is left, fp16.
#
# From the repository root, after the device prefix of ../shared/tools/device-prep.sh
# (carry [".whl"]; it installs fa-bench editable):
#
#   bash tools/gpu/issue18.sh
#
# Every step runs under a deadline and logs its exit code; a failing step does not stop
# the next. Files back under $OUT (8): steps.log, tests.log, run.log, results-bf16.json,
# results-fp16.json, sweep.log, sweep.json, summary.md.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
WORK=fa-bench-out/issue18
mkdir -p "$OUT" "$WORK"
LIMIT=${LIMIT:-500} # seconds of wall time for the whole script (an install before it: ~15 s)
# For a dry run of the plumbing on a CPU (the Triton interpreter), e.g.
#   LIMIT=300 D1=fp32 D2=fp16 SEQLENS=64 SWEEP_SEQ=64 SWEEP_D=64 \
#     DEV="--device cpu --batch 1 --heads 2" bash tools/gpu/issue18.sh
D1=${D1:-bf16} D2=${D2:-fp16} SEQLENS=${SEQLENS:-4096,16384}
SWEEP_SEQ=${SWEEP_SEQ:-16384} SWEEP_D=${SWEEP_D:-128}
read -r -a DEV <<< "${DEV:-}"
STEPS="$OUT/steps.log"

STEP_RESERVE=15 STEP_MIN=20 STEP_KILL=20
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

{
  git log --oneline -1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1
if ! python3 -c "import fa_bench.kernels.flash_kernels_bwd1" 2>> "$STEPS"; then
  echo "fa-bench from this tree is not installed: installing it editable" | tee -a "$STEPS"
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl \
    && export PYTHONPATH=$PWD/.site
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$STEPS" 2>&1
fi
fa-bench list impls 2>&1 | grep -A2 "triton" >> "$STEPS"

# (a) correctness on the GPU: both backwards (xdist when the image has it)
XDIST=()
python3 -c "import xdist" 2> /dev/null && XDIST=(-n 8)
step "gpu tests: test_flash_backward.py" 150 \
  python3 -m pytest -q -m gpu -x -p no:cacheprovider "${XDIST[@]}" tests/test_flash_backward.py \
  > "$OUT/tests.log" 2>&1
step "gpu tests: test_flash_attention.py (backward)" 60 \
  python3 -m pytest -q -m gpu -p no:cacheprovider "${XDIST[@]}" tests/test_flash_attention.py \
  -k "gpu_long_sequence or gpu_pointer_and_descriptor or gpu_deterministic" \
  >> "$OUT/tests.log" 2>&1
grep -E "passed|failed|error" "$OUT/tests.log" | tail -4 >> "$STEPS"

# (b) the standard suite's backward, bf16, 4k and 16k: ours both ways against cuDNN
RUN=(-s standard --mode bwd -i triton -i triton-onepass -i sdpa-cudnn --seqlen "$SEQLENS"
  --tuning-cache off --no-report --max-time 1.5 "${DEV[@]}")
step "run $D1" 130 fa-bench run "${RUN[@]}" --dtype "$D1" --out "$WORK/run-$D1" \
  > "$OUT/run.log" 2>&1
cp "$WORK/run-$D1/results.json" "$OUT/results-$D1.json" 2>> "$STEPS"

# (e) the one-pass dQ adds: scalar pointer atomics vs the TMA reduce-add (use_tma=True),
# with the two-kernel backward (the default) for scale (do_bench; not on a CPU)
[ -z "${DEV[*]}" ] && step "dQ adds: atomics vs TMA reduce-add" 60 python3 tools/gpu/issue18_tma_ab.py \
  > "$WORK/tma_ab.md" 2>&1

# (c) a short sweep of `triton`'s backward tiles (the two-kernel backward since the
# 2026-11-30 measurement; it was the one-pass one then): bf16, head_dim 128, 16k
step "sweep $D1 d$SWEEP_D $SWEEP_SEQ" 110 fa-bench sweep -s standard --mode bwd \
  --dtype "$D1" --seqlen "$SWEEP_SEQ" --block-m 64,128 --block-n 64,128 --warps 4,8 \
  --stages 1,2 --no-rules --budget-minutes 1.5 --max-time 0.5 --tuning-cache off \
  "${DEV[@]}" --head-dim "$SWEEP_D" --out "$WORK/sweep" > "$OUT/sweep.log" 2>&1
cp "$WORK/sweep/sweep.json" "$OUT/sweep.json" 2>> "$STEPS"

# (d) the summary: backward TFLOP/s per impl and shape, ÷ sdpa-cudnn
python3 tools/gpu/issue18_summary.py "$WORK/run-$D1" > "$OUT/summary.md" 2>&1
grep -E "^best|^sweep:" "$OUT/sweep.log" >> "$OUT/summary.md" 2>/dev/null
cat "$WORK/tma_ab.md" >> "$OUT/summary.md" 2>/dev/null

# then, as time allows: fp16
step "run $D2" 120 fa-bench run "${RUN[@]}" --dtype "$D2" --out "$WORK/run-$D2" \
  >> "$OUT/run.log" 2>&1
if [ -f "$WORK/run-$D2/results.json" ]; then
  cp "$WORK/run-$D2/results.json" "$OUT/results-$D2.json"
  python3 tools/gpu/issue18_summary.py "$WORK/run-$D2" >> "$OUT/summary.md" 2>&1
fi
echo "done after ${SECONDS} s" | tee -a "$STEPS"
