# Sourced by the GPU check scripts (tools/gpu/*.sh): their shared step runner.
#
# `step NAME CAP_S COMMAND...` runs COMMAND under min(CAP_S, time left - STEP_RESERVE)
# seconds, logging its start and exit code to $STEPS; with under STEP_MIN seconds to give
# it, the step is skipped (logged). It always returns 0, so a failing step never stops
# the steps after it. The script sets LIMIT (its wall-time budget) and STEPS (the log),
# and may set STEP_RESERVE (default 10 s kept for what follows), STEP_MIN (15 s) and
# STEP_KILL (10 s: the grace before SIGKILL after timeout's SIGTERM) before sourcing.

left() { echo $((LIMIT - SECONDS)); }

step() {
  local name=$1 cap=$2 budget
  shift 2
  budget=$(($(left) - ${STEP_RESERVE:-10}))
  [ "$budget" -gt "$cap" ] && budget=$cap
  if [ "$budget" -lt "${STEP_MIN:-15}" ]; then
    echo "[$(date -u +%T) +${SECONDS}s] $name: skipped (time left $(left) s)" | tee -a "$STEPS"
    return 0
  fi
  echo "[$(date -u +%T) +${SECONDS}s] $name: start (limit ${budget} s)" | tee -a "$STEPS"
  timeout -s TERM -k "${STEP_KILL:-10}" "$budget" "$@"
  local rc=$?  # saved before the echo: its $(date) would reset $?
  echo "[$(date -u +%T) +${SECONDS}s] $name: exit $rc" | tee -a "$STEPS"
  return 0
}

# `steps_header`: the commit and the torch and triton versions, the first lines of $STEPS
# (what every GPU check script logs before its first step).
steps_header() {
  {
    git log --oneline -1 2> /dev/null
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  } >> "$STEPS" 2>&1
}
