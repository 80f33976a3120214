#!/usr/bin/env bash
# Issue 21 item 3 (the fp8 e4m3 forward) in one device call, under LIMIT seconds (120):
# (a) the fp8 kernels' GPU tests, `tl` and Gluon (accuracy rule, lse, GQA, odd lengths,
# rows with no key, head_dim 64/96/128, 16k, other tiles and the descriptor path, every
# Gluon candidate; GLUON_TESTS=0 leaves the Gluon ones out); (b) `fa-bench run`
# forward at head_dim $HEAD_DIMS (128), N 4k and 16k, causal and not, fp8_e4m3 and bf16,
# implementations $IMPLS (`triton`; add `-i sdpa-cudnn` for scale: its fp8 cases record
# `unsupported`); (c) a summary, $OUT/fp8.md: fp8 ÷ bf16 per shape (target ≥ 1.3× at
# head_dim 128) and every case's accuracy; (d) with BENCH=1 and time left, an A/B of the
# launch choices with do_bench (tools/gpu/fp8_bench.py). Everything else goes into one
# archive, $OUT/fp8-files.tgz (steps, test log, run log, results.json, the A/B).
#
# From the repository root, after the device prefix (it installs fa-bench editable):
#
#   bash tools/gpu/fp8_check.sh                       # 120 s: tests, run, summary
#   LIMIT=180 HEAD_DIMS=128,64 BENCH=1 IMPLS="-i triton -i sdpa-cudnn" \
#     bash tools/gpu/fp8_check.sh                     # the first call's (2026-11-30) scope
#
# GLUON_ROLES=ws,... (e) adds tools/gpu/fp8_gluon_check.py for those roles ($OUT/fp8_gluon.md;
# GLUON_LIGHT=1: its --light);
# RUN=0 leaves out (b) and (c).
#
# Every step runs under a deadline and logs its exit code; a failing step does not stop
# the next.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
WORK=fa-bench-out/fp8
mkdir -p "$OUT" "$WORK"
LIMIT=${LIMIT:-120}
SEQLENS=${SEQLENS:-4096,16384} HEAD_DIMS=${HEAD_DIMS:-128} BENCH=${BENCH:-0}
read -r -a IMPLS <<< "${IMPLS:--i triton}"
read -r -a DEV <<< "${DEV:-}"
FILES="$WORK/files"
rm -rf "$WORK/run" "$FILES"  # a warm machine keeps the last call's run folder
mkdir -p "$FILES"
STEPS="$FILES/fp8-steps.log"

STEP_RESERVE=5 STEP_MIN=10 STEP_KILL=10
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

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
python3 -c "import xdist" 2> /dev/null && XDIST=(-n "${XDIST_N:-6}")
# GLUON_TESTS=1 (the default) adds the Gluon fp8 kernel's GPU tests (every candidate launch)
GLUON_TESTS=${GLUON_TESTS:-1}
TESTS=(tests/test_fp8_kernel.py)
[ "$GLUON_TESTS" = 1 ] && TESTS+=(tests/test_flash_gluon_fp8_gpu.py)
step "gpu tests: ${TESTS[*]}" "${TEST_CAP:-80}" \
  python3 -m pytest -q -m gpu -p no:cacheprovider "${XDIST[@]}" "${TESTS[@]}" \
  > "$FILES/fp8-tests.log" 2>&1
grep -E "passed|failed|error" "$FILES/fp8-tests.log" | tail -3 >> "$STEPS"

# (b) the standard suite's forward: ours in fp8 and bf16 (and $IMPLS's others); RUN=0 skips
# it and its summary
if [ "${RUN:-1}" = 1 ]; then
  step "run fp8_e4m3,bf16" 65 fa-bench run -s standard --mode fwd --dtype fp8_e4m3,bf16 \
    "${IMPLS[@]}" --head-dim "$HEAD_DIMS" --seqlen "$SEQLENS" \
    --tuning-cache off --no-report --no-telemetry --max-time 0.3 --min-samples 5 \
    --warmup 100 "${DEV[@]}" \
    --out "$WORK/run" > "$FILES/fp8-run.log" 2>&1
  cp "$WORK/run/results.json" "$FILES/fp8-results.json" 2>> "$STEPS"
  # (c) the summary
  step "summary" 10 python3 tools/gpu/fp8_summary.py "$WORK/run/results.json" "$OUT/fp8.md" \
    > /dev/null 2>> "$STEPS"
fi

# (d) launch choices, on request
if [ "$BENCH" = 1 ]; then
  step "fp8 A/B (do_bench)" 200 python3 tools/gpu/fp8_bench.py "$FILES/fp8_bench.md" \
    --json "$FILES/fp8_bench.json" --head-dims "$HEAD_DIMS" >> "$STEPS" 2>&1
fi
# (e) GLUON_ROLES=ws,ws-persist,...: the Gluon fp8 kernel's check (correctness and do_bench
# of those roles beside the bf16 forward and the tl fp8 kernel), $OUT/fp8_gluon.md
if [ -n "${GLUON_ROLES:-}" ]; then
  step "gluon fp8 check: $GLUON_ROLES" "${GLUON_CAP:-110}" \
    python3 tools/gpu/fp8_gluon_check.py --roles "$GLUON_ROLES" ${GLUON_LIGHT:+--light} \
    > "$FILES/fp8-gluon.log" 2>&1
fi
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
tar -czf "$OUT/fp8-files.tgz" -C "$FILES" .
