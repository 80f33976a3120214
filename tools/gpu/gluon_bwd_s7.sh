#!/usr/bin/env bash
# Issue 18 (session 7): the Gluon backward with its wgmma A operands from shared memory
# (GluonBwdConfig.ops_smem), one device call under LIMIT seconds (90). From the
# repository root:
#
#   PHASE=ab bash tools/gpu/gluon_bwd_s7.sh     # call 1
#   PHASE=run ROLE=128=ws-pss-early2,64=ws-pss-early bash tools/gpu/gluon_bwd_s7.sh  # call 2
#
# PHASE=ab: (1) tools/gpu/gluon_bwd_ab.py: each role of ROLES128 / ROLES64 (the first is
#   the baseline) as the kernel alone through do_bench, bf16, 16k tokens, head_dim 128
#   then 64, 4k/16k, causal both, beside cuDNN's backward; each role's gradients against
#   the baseline's on the same inputs (dK/dV bitwise, dQ's largest relative difference);
#   (2) with the time left, the GPU tests TESTS_K of tests/test_flash_gluon_bwd_s7.py.
# PHASE=run: (1) the GPU tests TESTS_K; (2) tools/gpu/gluon_bwd_run.py: `fa-bench run -s
#   standard --mode bwd` at 4k/16k for IMPLS, DTYPES in order, with
#   $FA_BENCH_GLUON_BWD_ROLE=$ROLE (empty: the heuristic as committed), and its table;
#   MEM=1: then fwd+bwd at 16k, head_dim 128, bf16, triton-onepass beside sdpa-flash
#   (peak memory, mem.log).
# PHASE=both: the A/B (AB_S seconds, 62), then fa-bench run's backward with the launch
#   per head_dim it measured fastest (tools/gpu/gluon_bwd_pick.py; the pick in steps.log).
# Everything in $OUT/gluon-bwd-s7.tgz (gluon_bwd_ab.md / gluon_bwd_run.md: the tables).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
LIMIT=${LIMIT:-90}
PHASE=${PHASE:-ab}
ROLES128=${ROLES128:-ws,ws-pss-early2,ws-sum-early2}
ROLES64=${ROLES64:-ws,ws-pss-early,ws-sum-early}
TESTS_K=${TESTS_K:-accuracy and 4097 and (pss-early or sum-early)}
ROLE=${ROLE:-}
IMPLS=${IMPLS:-triton-onepass,sdpa-cudnn}
DTYPES=${DTYPES:-bf16,fp16}
MAX_TIME=${MAX_TIME:-0.3}
FILES="$OUT/gluon-bwd-s7"
rm -rf "$FILES"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=4 STEP_MIN=10 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "PHASE=$PHASE ROLES128=$ROLES128 ROLES64=$ROLES64 TESTS_K=$TESTS_K ROLE=$ROLE"
  echo "IMPLS=$IMPLS DTYPES=$DTYPES MAX_TIME=$MAX_TIME"
} >> "$STEPS" 2>&1

tests() {
  [ -n "$TESTS_K" ] || return 0
  step "gpu tests" "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -k "$TESTS_K" \
    tests/test_flash_gluon_bwd_s7.py > "$FILES/tests.log" 2>&1
  tail -3 "$FILES/tests.log" >> "$STEPS"
}

ab() {
  step "gluon bwd a/b" "$1" env OUT="$FILES" AB_PROBE=0 AB_STALL_S=25 \
    python3 tools/gpu/gluon_bwd_ab.py --roles128 "$ROLES128" --roles64 "$ROLES64" > "$FILES/ab.log" 2>&1
  # a cut child leaves its lines: the table from them
  [ -f "$FILES/gluon_bwd_ab.md" ] || python3 tools/gpu/gluon_bwd_ab.py --from-lines \
    "$FILES/gluon-bwd-ab-lines.jsonl" --roles128 "$ROLES128" --roles64 "$ROLES64" \
    > "$FILES/gluon_bwd_ab.md" 2>> "$STEPS"
}

if [ "$PHASE" = ab ]; then
  ab 62
  tests 40
elif [ "$PHASE" = both ]; then
  # the A/B, then fa-bench run with the launch it measured fastest per head_dim
  ab "${AB_S:-62}"
  ROLE=$(python3 tools/gpu/gluon_bwd_pick.py "$FILES/gluon_bwd_ab.json" 2>> "$STEPS")
  echo "picked FA_BENCH_GLUON_BWD_ROLE=$ROLE" >> "$STEPS"
  BUDGET=$(($(left) - 6))
  step "fa-bench run bwd" "$BUDGET" env OUT="$FILES" FA_BENCH_GLUON_BWD_ROLE="$ROLE" \
    python3 tools/gpu/gluon_bwd_run.py --dtypes "$DTYPES" --impls "$IMPLS" \
    --budget "$((BUDGET - 3))" --max-time "$MAX_TIME" > "$FILES/run.log" 2>&1
else
  tests 30
  # MEM=1: the last MEM_S seconds measure fwd+bwd's peak memory at 16k beside sdpa-flash
  MEM_S=$([ "${MEM:-0}" = 1 ] && echo 24 || echo 0)
  BUDGET=$(($(left) - 8 - MEM_S))
  step "fa-bench run bwd" "$BUDGET" env OUT="$FILES" FA_BENCH_GLUON_BWD_ROLE="$ROLE" \
    python3 tools/gpu/gluon_bwd_run.py --dtypes "$DTYPES" --impls "$IMPLS" \
    --budget "$((BUDGET - 3))" --max-time "$MAX_TIME" > "$FILES/run.log" 2>&1
  if [ "$MEM_S" -gt 0 ]; then
    step "peak memory fwd_bwd 16k" "$((MEM_S - 2))" env FA_BENCH_GLUON_BWD_ROLE="$ROLE" \
      fa-bench run -s standard --mode fwd_bwd --seqlen 16384 --head-dim 128 --dtype bf16 \
      -i triton-onepass -i sdpa-flash --max-time 0.1 --no-report -o "$FILES/mem" \
      > "$FILES/mem.log" 2>&1
  fi
fi
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$FILES"/gluon_bwd_*.md "$OUT/" 2> /dev/null
tar -czf "$OUT/gluon-bwd-s7.tgz" -C "$FILES" .
