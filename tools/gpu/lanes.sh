#!/usr/bin/env bash
# Runs GPU check steps in two lanes at once, one per GPU of a two-GPU node (kind
# nvidia-h200-x2: device time counts the node's held time, so two lanes halve it), from
# the repository root after the device prefix of device-prep.sh:
#   LANE0="name:cap:command;name:cap:command" LANE1="..." bash tools/gpu/lanes.sh
# Each step runs with CUDA_VISIBLE_DEVICES set to its lane's GPU, OUT=$OUT/<name>, under
# `timeout` at its cap (seconds), its console in $OUT/<name>/console.log; a failing or
# killed step never stops the next. With one GPU the lanes run one after the other.
# At the end everything under $OUT is packed into $OUT/lanes.tgz (the device tool brings
# back few files).
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
mkdir -p "$OUT"

lane() {
  local gpu=$1 spec=$2 item name cap cmd t0
  IFS=';' read -r -a items <<< "$spec"
  for item in "${items[@]}"; do
    [ -z "$item" ] && continue
    name=${item%%:*}; item=${item#*:}; cap=${item%%:*}; cmd=${item#*:}
    mkdir -p "$OUT/$name"
    t0=$SECONDS
    echo "[$(date -u +%T)] gpu$gpu $name: start (cap ${cap} s): $cmd" | tee -a "$OUT/lanes.log"
    CUDA_VISIBLE_DEVICES=$gpu OUT=$OUT/$name timeout -s TERM -k 10 "$cap" bash -c "$cmd" \
      > "$OUT/$name/console.log" 2>&1
    echo "[$(date -u +%T)] gpu$gpu $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/lanes.log"
  done
}

gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  lane 0 "${LANE0:-}" &
  lane 1 "${LANE1:-}" &
  wait
else
  lane 0 "${LANE0:-};${LANE1:-}"
fi
tar -czf "$OUT/lanes.tgz" -C "$OUT" --exclude=lanes.tgz . 2>/dev/null
ls -la "$OUT"
