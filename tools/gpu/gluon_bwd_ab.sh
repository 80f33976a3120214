#!/usr/bin/env bash
# Issue 18 (session 6), one device call under LIMIT seconds (90): the Gluon backward's
# launches A/B'd at bf16 (tools/gpu/gluon_bwd_ab.py: each role's kernel, the first role
# without its dQ reduce-adds, cuDNN; head_dim 128 then
# 64, 4k/16k, causal both), first (TESTS_K set) the GPU tests of the roles that need them.
# From the repository root:
#
#   bash tools/gpu/gluon_bwd_ab.sh
#
# ROLES128 / ROLES64 (comma lists of candidate_bwd_configs roles, baseline first) pick
# the launches. Everything in $OUT/gluon-bwd-ab.tgz (gluon_bwd_ab.md is the table).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=110
OUT=${OUT:-fa-bench-out/out}
export OUT
LIMIT=${LIMIT:-90}
ROLES128=${ROLES128:-ws,ws-early2,ws-dqfirst}
ROLES64=${ROLES64:-ws,ws-dqfirst}
# the GPU tests run first on what the roles need (pytest -k; empty: none)
TESTS_K=${TESTS_K:-}
FILES="$OUT/gluon-bwd-ab"
rm -rf "$FILES"
mkdir -p "$FILES"
STEPS="$FILES/steps.log"
STEP_RESERVE=4 STEP_MIN=10 STEP_KILL=5
# shellcheck source=tools/gpu/steps.sh
. "$(dirname "$0")/steps.sh"

{
  git log --oneline -1 2> /dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$STEPS" 2>&1

if [ -n "$TESTS_K" ]; then
  step "gpu tests" 30 python3 -m pytest -q -m gpu -p no:cacheprovider -k "$TESTS_K" \
    tests/test_flash_gluon_bwd_s6.py > "$FILES/tests.log" 2>&1
  tail -3 "$FILES/tests.log" >> "$STEPS"
fi
step "gluon bwd a/b" 80 env OUT="$FILES" python3 tools/gpu/gluon_bwd_ab.py \
  --roles128 "$ROLES128" --roles64 "$ROLES64" > "$FILES/ab.log" 2>&1
# a cut child leaves its lines: the table from them
[ -f "$FILES/gluon_bwd_ab.md" ] || python3 tools/gpu/gluon_bwd_ab.py --from-lines \
  "$FILES/gluon-bwd-ab-lines.jsonl" --roles128 "$ROLES128" --roles64 "$ROLES64" \
  > "$FILES/gluon_bwd_ab.md" 2>> "$STEPS"
echo "[$(date -u +%T) +${SECONDS}s] done" >> "$STEPS"
cp "$FILES/gluon_bwd_ab.md" "$OUT/" 2> /dev/null
tar -czf "$OUT/gluon-bwd-ab.tgz" -C "$FILES" .
