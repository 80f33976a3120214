#!/usr/bin/env bash
# Issue 19's GPU check of our kernel's variants in one device call (one H200, ~3 minutes),
# in order of importance (each step has a deadline; LIMIT cuts the last ones first):
#   (1) the GPU tests (bf16/fp16 at realistic sizes, pointer and TMA paths, a
#       deterministic variant backward);
#   (2) a direct timing of the variants against our dense kernel
#       (tools/gpu/variants_bench.py: window 4k at 32k, softcap 50, ALiBi at 8k);
#   (3) `fa-bench run` of softcap 50 and ALiBi at 8k (batch 8) beside the plain causal
#       kernel, triton and flex, fwd and bwd, bf16;
#   (4) the packed batch of about 16k tokens from mixed lengths (uniform:256-3840, 8
#       documents) beside 8 equal 2048-token sequences; a 4k sliding window, causal, at
#       32k beside the dense causal control (triton, flex, sdpa-cudnn);
# and a summary of the issue's ratios into $OUT/variants.md (tools/gpu/variants_summary.py).
#
# From the repository root (fa-bench installed editable, or installed here if not):
#
#   bash tools/gpu/variants_check.sh
#
# TESTS=0 skips (1), BENCH=0 skips (2), MODES=bwd runs only the backward cases in (3)-(4),
# MOD_IMPLS=triton FLEX_LAST=1 times flex's softcap and ALiBi cases last:
#   TESTS=0 BENCH=0 MODES=bwd MOD_IMPLS=triton FLEX_LAST=1 LIMIT=170 \
#     bash tools/gpu/variants_check.sh
#
# Every step runs under a deadline and logs its exit code; a failing step does not stop
# the next. Files back under $OUT, each named variants*: variants-steps.log,
# variants_bench.md, variants-tests.log, variants-run-*.log, variants-results-*.json,
# variants.md (the summary).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
# a fresh folder per invocation: `fa-bench run --out` refuses one that holds a run (a
# second call on a warm machine keeps the first one's outputs)
WORK=fa-bench-out/variants/$(date -u +%H%M%S)
mkdir -p "$OUT" "$WORK"
LIMIT=${LIMIT:-200} # seconds of wall time for the whole script
# For a dry run of the plumbing on a CPU (the Triton interpreter), e.g.
#   LIMIT=300 DTYPE=fp32 IMPLS=triton,naive HD=32 WIN=16,0 SEQ_WIN=64 SEQ_MOD=64 \
#     SEQ_PACK=32 VARLEN=uniform:8-56 BATCH=2 TESTS=0 \
#     DEV="--device cpu --heads 4 --kv-heads 2" bash tools/gpu/variants_check.sh
DTYPE=${DTYPE:-bf16} IMPLS=${IMPLS:-triton,flex,sdpa-cudnn} HD=${HD:-128}
WIN=${WIN:-4096,0} SEQ_WIN=${SEQ_WIN:-32768} SEQ_MOD=${SEQ_MOD:-8192}
SEQ_PACK=${SEQ_PACK:-2048} VARLEN=${VARLEN:-uniform:256-3840} BATCH=${BATCH:-}
MAXT=${MAXT:-0.4} TESTS=${TESTS:-1} BENCH=${BENCH:-1}
# MODES=bwd runs the suite's backward cases only (the variants' backward, part VB)
read -r -a MODE_FLAGS <<< "$(echo "${MODES:-fwd,bwd}" | sed 's/\([^,]*\),*/--mode \1 /g')"
read -r -a DEV <<< "${DEV:-}"
STEPS="$OUT/variants-steps.log"

STEP_RESERVE=10 STEP_MIN=15 STEP_KILL=10
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

{
  git log --oneline -1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1
if ! python3 -c "import fa_bench.kernels.flash_varlen" 2>> "$STEPS"; then
  echo "fa-bench from this tree is not installed: installing it editable" | tee -a "$STEPS"
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl \
    && export PYTHONPATH=$PWD/.site
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$STEPS" 2>&1
fi

# (1) correctness on the GPU (xdist when the image has it)
if [ "$TESTS" = 1 ]; then
  XDIST=()
  python3 -c "import xdist" 2> /dev/null && XDIST=(-n 8)
  step "gpu tests: test_flash_variants_gpu.py" 55 \
    python3 -m pytest -q -m gpu -p no:cacheprovider "${XDIST[@]}" tests/test_flash_variants_gpu.py \
    > "$OUT/variants-tests.log" 2>&1
  grep -E "passed|failed|error" "$OUT/variants-tests.log" | tail -3 >> "$STEPS"
fi

# (2) our variants against our dense kernel, timed directly (forward key tile 128 and 64)
if [ -z "${DEV[*]}" ] && [ "$BENCH" = 1 ]; then
  step "bench: variants vs dense" 40 python3 tools/gpu/variants_bench.py \
    > "$OUT/variants_bench.md" 2>&1
fi

# (3) measurements: subsets of the variants suite, fwd and bwd, no report (softcap and
# ALiBi against flex first: the first call ran out of time before them)
COMMON=(-s variants --dtype "$DTYPE" --head-dim "$HD" "${MODE_FLAGS[@]}" --no-report
  --max-time "$MAXT" --tuning-cache off "${DEV[@]}")
run() { # run NAME CAP IMPLS ARGS...: one fa-bench run into $WORK/NAME, its results to $OUT
  local name=$1 cap=$2 impls=$3
  shift 3
  step "run $name" "$cap" fa-bench run "${COMMON[@]}" --impl "$impls" "$@" \
    --out "$WORK/$name" > "$OUT/variants-run-$name.log" 2>&1
  cp "$WORK/$name/results.json" "$OUT/variants-results-$name.json" 2>> "$STEPS"
}
run mods 60 "${MOD_IMPLS:-triton,flex}" --seqlen "$SEQ_MOD" --batch "${BATCH:-8}" --window none \
  --softcap 0,50 --varlen none

# (4) the packed batch (its backward grid changed since the first call), then the window
# at 32k (triton, flex, sdpa-cudnn)
run packed 20 triton --seqlen "$SEQ_PACK" --batch "${BATCH:-8}" --window none --softcap 0 \
  --no-alibi --varlen "$VARLEN" --varlen none
run window 30 "$IMPLS" --seqlen "$SEQ_WIN" --batch "${BATCH:-2}" --window "$WIN" \
  --window none --softcap 0 --no-alibi --varlen none
# FLEX_LAST=1 (with MOD_IMPLS=triton): flex's softcap 50 and ALiBi cases last, one run
# each (flex compiles each score_mod for tens of seconds: our ratios come first)
if [ "${FLEX_LAST:-0}" = 1 ]; then
  run flexcap 35 flex --seqlen "$SEQ_MOD" --batch "${BATCH:-8}" --window none --softcap 50 \
    --no-alibi --varlen none
  run flexalibi 35 flex --seqlen "$SEQ_MOD" --batch "${BATCH:-8}" --window none --softcap 0 \
    --alibi --varlen none
fi

# (5) the issue's ratios
python3 tools/gpu/variants_summary.py "$OUT"/variants-results-*.json > "$OUT/variants.md" 2>&1
cat "$OUT/variants_bench.md" >> "$OUT/variants.md" 2> /dev/null
cat "$OUT/variants.md" >> "$STEPS"
echo "done after ${SECONDS} s" | tee -a "$STEPS"
