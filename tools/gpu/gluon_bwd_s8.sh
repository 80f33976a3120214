#!/usr/bin/env bash
# Issue 18 (session 8): the Gluon backward's planned launches (kernels/flash_gluon_bwd_plan.py)
# and the d64 default ws-pss-early, one device call under LIMIT seconds. From the
# repository root:
#
#   PHASE=final LIMIT=170 bash tools/gpu/gluon_bwd_s8.sh   # call 2 (AB_S=0: no A/B, planned)
#   PHASE=ab LIMIT=90 bash tools/gpu/gluon_bwd_s8.sh       # a development A/B
#
# PHASE=final: (1) tools/gpu/gluon_bwd_host.py at AB_DIMS x AB_SEQ (16k), non-causal (AB_S
#   s): triton-onepass planned and unplanned beside sdpa-cudnn, host µs and timing.measure
#   as fa-bench run takes it; the pick ($FA_BENCH_GLUON_BWD_PLAN: 0 only if unplanned
#   measured >1% faster) in steps.log; (2) the plan's GPU tests (TESTS_K: the bf16 ones,
#   the refilled buffer, the unplannable rows and flash_attention's call, and
#   test_flash_gluon_bwd.py's dispatch test; TESTS_S s); (3) fa-bench
#   run -s standard --mode bwd --seqlen 4096,16384 -i triton-onepass -i sdpa-cudnn, bf16
#   then fp16, each dtype its own step of RUN_S s (tools/gpu/gluon_bwd_run.py).
# PHASE=ab: the host A/B at head_dim 128,64 x 16k,4k x causal both (AB_S, 60 s), then the
#   GPU tests with the time left.
# Everything in $OUT/gluon-bwd-s8.tgz; gluon_bwd_host.md, gluon_bwd_run_bf16.md and
# gluon_bwd_run_fp16.md also copied to $OUT.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
LIMIT=${LIMIT:-170}
PHASE=${PHASE:-final}
MAX_TIME=${MAX_TIME:-0.2}
FILES="$OUT/gluon-bwd-s8"
rm -rf "$FILES"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=4 STEP_MIN=10 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"
steps_header
echo "PHASE=$PHASE LIMIT=$LIMIT MAX_TIME=$MAX_TIME" >> "$STEPS"

host_ab() {  # $1 cap, $2 dims, $3 seqlens, $4 causal
  step "host a/b" "$1" python3 tools/gpu/gluon_bwd_host.py --dims "$2" --seqlens "$3" \
    --causal "$4" --out "$FILES" > "$FILES/gluon_bwd_host.md" 2> "$FILES/host.log"
  tail -3 "$FILES/host.log" >> "$STEPS"
}

tests() {
  step "gpu tests" "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -k "${TESTS_K:-}" \
    tests/test_flash_gluon_bwd_plan.py tests/test_flash_gluon_bwd.py > "$FILES/tests.log" 2>&1
  tail -3 "$FILES/tests.log" >> "$STEPS"
}

run_dtype() {  # $1 dtype, $2 cap
  step "fa-bench run bwd $1" "$2" env OUT="$FILES" python3 tools/gpu/gluon_bwd_run.py \
    --dtypes "$1" --impls triton-onepass,sdpa-cudnn --budget "$(($2 - 3))" \
    --max-time "$MAX_TIME" --md "gluon_bwd_run_$1.md" > "$FILES/run-$1.out" 2>&1
}

if [ "$PHASE" = ab ]; then
  host_ab "${AB_S:-60}" 128,64 16384,4096 no,yes
  TESTS_K=${TESTS_K:-bwd_plan or dispatched} tests 40
else
  host_ab "${AB_S:-28}" "${AB_DIMS:-128,64}" "${AB_SEQ:-16384}" no
  PLAN=$(python3 tools/gpu/gluon_bwd_host.py --pick "$FILES/gluon_bwd_host.jsonl" 2>> "$STEPS")
  export FA_BENCH_GLUON_BWD_PLAN=${PLAN:-1}
  echo "picked FA_BENCH_GLUON_BWD_PLAN=$FA_BENCH_GLUON_BWD_PLAN" >> "$STEPS"
  TESTS_K=${TESTS_K:-(bwd_plan and (bfloat16 or refilled or unplannable)) or dispatched} tests "${TESTS_S:-25}"
  run_dtype bf16 "${RUN_S:-55}"
  run_dtype fp16 "$(($(left) - 6))"
fi
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$FILES"/gluon_bwd_*.md "$OUT/" 2> /dev/null
tar -czf "$OUT/gluon-bwd-s8.tgz" -C "$FILES" .
