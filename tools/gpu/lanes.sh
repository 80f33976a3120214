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
#
# Steps are separated by ';'. A command may hold anything else (&&, >, $OUT, quotes); a
# ';' inside a command is written '\;' (the step's command gets a plain ';'), or the steps
# go one per line in a file named by LANE0_FILE / LANE1_FILE (taken instead of LANE0 /
# LANE1; blank lines and lines starting with '#' skipped), where ';' is never split.
# Every step is checked before the first runs: a name of letters, digits, '_', '.', '-',
# a cap in whole seconds, a command bash can parse. One that is not (an unescaped ';'
# inside a command splits it into pieces that are not) stops the script with exit 2,
# naming the lane, the step and what is wrong, before anything runs.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=120
OUT=${OUT:-fa-bench-out/out}
SEP=$'\x1f'  # stands in for an escaped ';' while a lane string is split

# parse LABEL TEXT FROM_FILE: the lane's steps, checked, into the array STEPS_OUT
parse() {
  local label=$1 text=$2 from_file=$3 item name rest cap cmd n=0 err
  local -a items=()
  if [ "$from_file" = 1 ]; then
    mapfile -t items <<< "$text"
  else
    text=${text//\\;/$SEP}
    IFS=';' read -r -d '' -a items < <(printf '%s' "$text")
  fi
  STEPS_OUT=()
  for item in "${items[@]}"; do
    item=${item//$SEP/;}
    [[ -z "${item//[[:space:]]/}" ]] && continue
    [[ "$from_file" = 1 && "$item" =~ ^[[:space:]]*# ]] && continue
    n=$((n + 1))
    name=${item%%:*}; rest=${item#*:}; cap=${rest%%:*}; cmd=${rest#*:}
    err=""
    if [[ "$item" != *:*:* ]]; then
      err="not name:cap:command (a ';' inside a command splits it: write \\; or use ${label}_FILE)"
    elif ! [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]]; then
      err="name '$name' is not letters, digits, '_', '.', '-' (a ';' inside the previous step's command? write \\;)"
    elif ! [[ "$cap" =~ ^[0-9]+$ ]] || [ "$cap" -eq 0 ]; then
      err="cap '$cap' is not a whole number of seconds"
    elif ! bash -n -c "$cmd" 2>/dev/null; then
      err="bash cannot parse its command (a ';' inside quotes split it? write \\; or use ${label}_FILE)"
    fi
    if [ -n "$err" ]; then
      echo "lanes.sh: $label step $n ('$item'): $err" >&2
      exit 2
    fi
    STEPS_OUT+=("$item")
  done
}

lane_steps() {  # LANE: its file's or its string's steps, into STEPS_OUT
  local label=$1 file_var=${1}_FILE
  if [ -n "${!file_var:-}" ]; then
    if [ ! -r "${!file_var}" ]; then
      echo "lanes.sh: $file_var=${!file_var}: no such readable file" >&2
      exit 2
    fi
    parse "$label" "$(cat "${!file_var}")" 1
  else
    parse "$label" "${!label:-}" 0
  fi
}

lane() {  # GPU STEP...
  local gpu=$1 item name cap cmd t0 rc
  shift
  for item in "$@"; do
    name=${item%%:*}; item=${item#*:}; cap=${item%%:*}; cmd=${item#*:}
    mkdir -p "$OUT/$name"
    t0=$SECONDS
    echo "[$(date -u +%T)] gpu$gpu $name: start (cap ${cap} s): $cmd" | tee -a "$OUT/lanes.log"
    CUDA_VISIBLE_DEVICES=$gpu OUT=$OUT/$name timeout -s TERM -k 10 "$cap" bash -c "$cmd" \
      > "$OUT/$name/console.log" 2>&1
    rc=$?  # saved before the echo: its $(date) would reset $? (it logged 0 for every step)
    echo "[$(date -u +%T)] gpu$gpu $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/lanes.log"
  done
}

lane_steps LANE0
steps0=("${STEPS_OUT[@]}")
lane_steps LANE1
steps1=("${STEPS_OUT[@]}")
mkdir -p "$OUT"

gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  lane 0 "${steps0[@]}" &
  lane 1 "${steps1[@]}" &
  wait
else
  lane 0 "${steps0[@]}" "${steps1[@]}"
fi
tar -czf "$OUT/lanes.tgz" -C "$OUT" --exclude=lanes.tgz . 2>/dev/null
ls -la "$OUT"
