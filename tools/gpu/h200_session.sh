#!/usr/bin/env bash
# The GPU validation of the open issues, in phases sized for the device tool's 10-minute
# calls. Run from the repo root on the H200; results go to fa-bench-out/ (kept while the
# machine stays warm) and are copied to $OUT. Each long run stops itself with SIGINT
# before the call's limit and is finished by the next call with --resume.
#
# Needs fa-bench installed with its dependencies (plotly for the report) and nothing
# outside this repository. On a machine without a package index, name a folder of the
# wheels it lacks (e.g. plotly's) with FA_BENCH_WHEELS=DIR: the script then installs them
# into .site and this checkout editable before the phase; without them it stops with a
# message saying what is missing.
#
# Phases:
#   bash tools/gpu/h200_session.sh checks      # gpu tests, env, do_bench cross-check
#   bash tools/gpu/h200_session.sh standard    # issues 2+3: the standard suite, 5 impls
#   bash tools/gpu/h200_session.sh telemetry   # issue 4 figures at 16k
#   bash tools/gpu/h200_session.sh multigpu    # issue 8 on one GPU: --gpus all, merged
#   bash tools/gpu/h200_session.sh memory      # issue 3: fwd+bwd peak memory at 16k
#   BASE=DIR bash tools/gpu/h200_session.sh refactor-ab  # issue 14: standard bf16 grid, DIR vs this tree
#   bash tools/gpu/h200_session.sh first       # checks, memory, multigpu, then standard
#   bash tools/gpu/h200_session.sh gate        # issue 6: A/A and a slowed run, compared
#   bash tools/gpu/h200_session.sh warmup      # issue 6: --warmup 20 vs 500 on cuDNN A/A
#   bash tools/gpu/h200_session.sh sweep       # issue 7: sweep and save (then sweep-ab if time)
#   bash tools/gpu/h200_session.sh heuristic-fp32 # the same for the fp32 d64 backward
#   CACHE=F bash tools/gpu/h200_session.sh sweep-ab  # issue 7: triton before/after with F
#   bash tools/gpu/h200_session.sh sweep-causal # issue 7: causal forward tiles, 512-4k
#   bash tools/gpu/h200_session.sh heuristic   # issue 7: new vs old heuristic (d64 bwd, short causal fwd)
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off

if [ -n "${FA_BENCH_WHEELS:-}" ] && [ -z "${FA_BENCH_WHEELS_DONE:-}" ]; then
  if ! ls "$FA_BENCH_WHEELS"/*.whl > /dev/null 2>&1; then
    echo "FA_BENCH_WHEELS=$FA_BENCH_WHEELS: no .whl files there" >&2; exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --target .site "$FA_BENCH_WHEELS"/*.whl \
    && export PYTHONPATH=$PWD/.site${PYTHONPATH:+:$PYTHONPATH} \
    && python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
  export FA_BENCH_WHEELS_DONE=1  # the phases that call this script again skip the install
fi
if ! command -v fa-bench > /dev/null || ! python3 -c "import fa_bench, plotly" 2> /dev/null; then
  echo "$0: fa-bench or plotly is not importable here: pip install -e . (offline:" \
    "FA_BENCH_WHEELS=DIR with the missing wheels; see the top of this script)" >&2
  exit 2
fi
OUT=${OUT:-/tmp/out}
RUNS=fa-bench-out
mkdir -p "$RUNS" "$OUT"
budget=${BUDGET:-500}

case "${1:-}" in
checks)
  fa-bench env > "$OUT/env.txt" 2>&1
  # test_reference's GPU tests ran on the H200 on 2026-11-29 (36 passed) and take ~9 min.
  timeout 240 pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_flash_attention.py \
    tests/test_accuracy.py 2>&1 | tail -40 > "$OUT/gpu-tests.txt"
  # Telemetry and timing measure the whole GPU: never beside other tests (-n 8 once let a
  # copy-vs-NVML check pass on the other tests' traffic).
  timeout 120 pytest -q -m gpu -p no:cacheprovider tests/test_telemetry.py \
    tests/test_timing.py 2>&1 | tail -30 >> "$OUT/gpu-tests.txt"
  python3 tools/gpu/gpm_window.py > "$OUT/gpm.txt" 2>&1
  python3 tools/gpu/crosscheck_do_bench.py "$RUNS/xcheck" > "$OUT/xcheck.txt" 2>&1
  grep -E "passed|failed" "$OUT/gpu-tests.txt"; cat "$OUT/gpm.txt"; grep XCHECK "$OUT/xcheck.txt"
  ;;
standard)
  # A fresh machine: pick up the run that an earlier call carried back (.carry/std-run.tgz).
  [ -f "$RUNS/std/plan.json" ] || [ ! -f .carry/std-run.tgz ] || tar xzf .carry/std-run.tgz
  if [ -f "$RUNS/std/plan.json" ]; then
    timeout -s INT "$budget" fa-bench run --resume "$RUNS/std" > "$OUT/std.log" 2>&1
  else
    timeout -s INT "$budget" fa-bench run --suite standard --impl naive --impl sdpa-flash \
      --impl sdpa-cudnn --impl flex --impl triton --no-telemetry --out "$RUNS/std" \
      > "$OUT/std.log" 2>&1
  fi
  echo "fa-bench exit: $?" >> "$OUT/std.log"
  cp "$RUNS/std/results.json" "$RUNS/std/report.html" "$OUT/" 2>/dev/null
  tar czf "$OUT/std-run.tgz" "$RUNS/std"
  tail -c 4000 "$OUT/std.log"
  ;;
telemetry)
  fa-bench run -s standard -i naive -i sdpa-cudnn -i triton --dtype bf16 --head-dim 128 \
    --seqlen 16384 --mode fwd --no-causal --out "$RUNS/tel16k" > "$OUT/tel.log" 2>&1
  python3 - "$RUNS/tel16k/results.json" <<'PY' | tee "$OUT/tel.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print("calibration", d["env"].get("telemetry", {}).get("calibration"))
keys = ("gbps_nvml", "dram_bw_util_pct", "tensor_util_pct", "hmma_util_pct", "power_w_mean",
        "energy_j_per_call", "bytes_ratio_measured_to_model", "throttle_reasons", "warnings")
for c in d["cases"]:
    t = c.get("telemetry") or {}
    print(c["impl"], c["status"], f"{c['tflops'] or 0:.1f} TFLOP/s", {k: t.get(k) for k in keys})
PY
  ;;
memory)
  fa-bench run -s standard -i triton -i sdpa-flash --mode fwd_bwd --seqlen 16384 \
    --no-telemetry --no-report --out "$RUNS/mem16k" > "$OUT/mem.log" 2>&1
  python3 - "$RUNS/mem16k/results.json" <<'PY' | tee "$OUT/mem.txt"
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    peak = c["peak_mem_bytes"]
    print(c["id"], c["status"], f"{peak / 2**30:.3f} GiB" if peak else None)
PY
  ;;
multigpu)
  fa-bench run -s smoke --device cuda --gpus all --no-telemetry --out "$RUNS/multi" \
    > "$OUT/multi.log" 2>&1
  echo "fa-bench exit: $?" >> "$OUT/multi.log"
  cp "$RUNS/multi/results.json" "$OUT/multi-results.json" 2>/dev/null
  tail -c 3000 "$OUT/multi.log"
  ;;
gate)
  # Issue 6: two back-to-back runs at the default warm-up, then a deliberately slowed
  # triton (bf16, d128: enough to show the gate names it), compared with the first run.
  # GATE_FLAGS adds run flags (e.g. "--warmup 20" to see the old default fail).
  flags=${GATE_FLAGS:---no-telemetry}
  for x in a b; do
    timeout -s INT 280 fa-bench run --suite standard --impl sdpa-cudnn --impl triton $flags \
      --no-report --out "$RUNS/gate-$x" > "$OUT/gate-$x.log" 2>&1
    echo "run $x exit $? at ${SECONDS}s"
  done
  fa-bench compare "$RUNS/gate-a" "$RUNS/gate-b" --markdown "$OUT/gate-ab.md" > "$OUT/gate-ab.txt" 2>&1
  echo "compare a b exit $?"
  python3 tests/slow_tuning.py "$RUNS/slow-cache.json"
  timeout -s INT 120 fa-bench run --suite standard --impl triton --dtype bf16 --head-dim 128 \
    $flags --tuning-cache "$RUNS/slow-cache.json" --no-report --out "$RUNS/gate-slow" \
    > "$OUT/gate-slow.log" 2>&1
  echo "slow run exit $? at ${SECONDS}s"
  fa-bench compare "$RUNS/gate-a" "$RUNS/gate-slow" --filter 'impl=triton,dtype=bf16,head_dim=128' \
    --markdown "$OUT/gate-slow.md" > "$OUT/gate-slow.txt" 2>&1
  echo "compare a slow exit $?"
  tail -4 "$OUT/gate-ab.txt" "$OUT/gate-slow.txt"
  (cd "$OUT" && tar czf gate-logs.tgz --remove-files ./*.txt ./*.log)
  cp "$RUNS/gate-a/results.json" "$OUT/gate-a.json"; cp "$RUNS/gate-b/results.json" "$OUT/gate-b.json"
  ;;
warmup)
  # Does a longer warm-up make back-to-back runs of power-hungry cuDNN agree?
  for w in 20 500; do
    for x in a b; do
      fa-bench run -s standard -i sdpa-cudnn --seqlen 4096 --seqlen 16384 --no-telemetry \
        --warmup "$w" --no-report --out "$RUNS/w$w-$x" > /dev/null 2>&1
    done
    echo "warmup $w ms:"; fa-bench compare "$RUNS/w$w-a" "$RUNS/w$w-b" 2>&1 | tail -3
  done
  ;;
sweep)
  # Issue 7: sweep the issue's grid (bf16, D 64/128, N 1k/4k/16k, causal and not, fwd and
  # bwd) inside one call and save the best configs. Since 2026-11-29 (2nd run) the sweep
  # builds every config first in parallel and measures each rule of thumb's tile too, and
  # times each point after a 200 ms warm-up (SWEEP_WARMUP): the points run back to back,
  # the clock settles within 200 ms (docs/measurement.md), and run's 500 ms default would
  # add ~2 minutes to the 24 cases. Then, if the call has time left, sweep-ab.
  cache="$RUNS/tuning-h200.json"
  fa-bench sweep -s standard --dtype bf16 --head-dim 64 --head-dim 128 --seqlen 1024 \
    --seqlen 4096 --seqlen 16384 --mode fwd --mode bwd --block-m 64,128 --block-n 64,128 \
    --warps 4,8 --stages 2,3 --max-time 0.5 --warmup "${SWEEP_WARMUP:-200}" --budget-minutes "${SWEEP_MIN:-9}" \
    --save-best --tuning-cache "$cache" --out "$RUNS/sweep" > "$OUT/sweep.log" 2>&1
  echo "sweep exit $? at ${SECONDS}s"; cp "$RUNS/sweep/sweep.json" "$cache" "$OUT/" 2>/dev/null
  grep -E "compiled|stopped" "$OUT/sweep.log"; tail -32 "$OUT/sweep.log"
  if [ "$SECONDS" -lt 330 ]; then CACHE="$cache" bash "$0" sweep-ab; fi
  ;;
sweep-causal)
  # Issue 7: the grid sweep found 64x64 tiles (4 warps) 6-15% faster than the default for
  # the causal forward at 1k tokens; is that true around it (512-4k, fp16 and bf16)?
  fa-bench sweep -s standard --dtype bf16 --dtype fp16 --head-dim 64 --head-dim 128 \
    --seqlen 512 --seqlen 1024 --seqlen 2048 --seqlen 4096 --mode fwd --causal \
    --block-m 64,128 --block-n 64,128 --warps 4,8 --stages 3 --no-rules --max-time 0.5 \
    --warmup "${SWEEP_WARMUP:-200}" --budget-minutes 6 --out "$RUNS/sweep-causal" \
    > "$OUT/sweep-causal.log" 2>&1
  echo "sweep exit $? at ${SECONDS}s"; cp "$RUNS/sweep-causal/sweep.json" "$OUT/sweep-causal.json"
  grep -E "compiled|stopped" "$OUT/sweep-causal.log"; tail -24 "$OUT/sweep-causal.log"
  ;;
heuristic)
  # Issue 7: the heuristic's two sweep-driven changes against the old configs, pinned
  # through a tuning cache, back to back: the d64 backward (64x64 tiles, 4 warps; old
  # 64x128, 8 warps) and the causal forward up to 1k (64x64, 4 warps; old 128x64 w4 at
  # d64, 128x128 w8 at d128; 2k is the unchanged control).
  PYTHONPATH=tests:${PYTHONPATH:-} python3 - "$RUNS/old-heuristic.json" <<'PY'
import json, sys, torch
from fa_bench.sweep.tuning import SCHEMA
from slow_tuning import pinned_entries
gpu, dt = torch.cuda.get_device_name(0), ("fp16", "bf16")
fwd = lambda m, n, w: {"block_m": m, "block_n": n, "num_warps": w, "num_stages": 3}
bwd = {"bwd_block_m": 64, "bwd_block_n": 128, "bwd_num_warps": 8, "bwd_num_stages": 3}
entries = pinned_entries(gpu, {"bwd": bwd, "fwd": fwd(128, 64, 4)}, dtypes=dt, head_dims=(64,))
entries += pinned_entries(gpu, {"fwd": fwd(128, 128, 8)}, dtypes=dt, head_dims=(128,))
json.dump({"schema": SCHEMA, "entries": entries}, open(sys.argv[1], "w"), indent=1)
PY
  for x in old new; do
    c=off; [ "$x" = old ] && c="$RUNS/old-heuristic.json"
    fa-bench run -s standard -i triton --head-dim 64 --mode bwd --tuning-cache "$c" \
      --no-telemetry --no-report --out "$RUNS/bwd64-$x" > "$OUT/bwd64-$x.log" 2>&1
    echo "bwd64 $x exit $? at ${SECONDS}s"
    fa-bench run -s standard -i triton --mode fwd --causal --seqlen 512 --seqlen 1024 \
      --seqlen 2048 --tuning-cache "$c" --no-telemetry --no-report --out "$RUNS/fwdc-$x" \
      > "$OUT/fwdc-$x.log" 2>&1
    echo "fwd causal $x exit $? at ${SECONDS}s"
  done
  for r in bwd64 fwdc; do
    fa-bench compare "$RUNS/$r-old" "$RUNS/$r-new" --markdown "$OUT/$r.md" > "$OUT/$r.txt" 2>&1
    echo "compare $r old new exit $?"; tail -n 1 "$OUT/$r.txt"
  done
  ;;
heuristic-fp32)
  # The d64 backward change reaches fp32 through the halving rule (32x64 w4 s1; old 32x128
  # w8 s1), unswept: old pinned vs new on the standard grid in fp32.
  PYTHONPATH=tests:${PYTHONPATH:-} python3 - "$RUNS/old-fp32.json" <<'PY'
import json, sys, torch
from fa_bench.sweep.tuning import SCHEMA
from slow_tuning import pinned_entries
bwd = {"bwd_block_m": 32, "bwd_block_n": 128, "bwd_num_warps": 8, "bwd_num_stages": 1}
entries = pinned_entries(torch.cuda.get_device_name(0), {"bwd": bwd}, dtypes=("fp32",),
                         head_dims=(64,))
json.dump({"schema": SCHEMA, "entries": entries}, open(sys.argv[1], "w"), indent=1)
PY
  for x in old new; do
    c=off; [ "$x" = old ] && c="$RUNS/old-fp32.json"
    timeout -s INT 150 fa-bench run -s standard -i triton --dtype fp32 --head-dim 64 \
      --mode bwd --tuning-cache "$c" --no-telemetry --no-report --out "$RUNS/bwd64f-$x" \
      > "$OUT/bwd64f-$x.log" 2>&1
    echo "bwd64 fp32 $x exit $? at ${SECONDS}s"
  done
  fa-bench compare "$RUNS/bwd64f-old" "$RUNS/bwd64f-new" --markdown "$OUT/bwd64f.md" \
    > "$OUT/bwd64f.txt" 2>&1
  echo "compare exit $?"; tail -n 1 "$OUT/bwd64f.txt"
  ;;
sweep-ab)
  # Issue 7: the standard suite's triton cases with the heuristic, then with the sweep's
  # cache ($CACHE), back to back, compared on the swept grid and on all of bf16.
  for x in before after; do
    c=off; [ "$x" = after ] && c="$CACHE"
    timeout -s INT 200 fa-bench run --suite standard --impl triton --tuning-cache "$c" \
      --no-telemetry --no-report --out "$RUNS/tri-$x" > "$OUT/tri-$x.log" 2>&1
    echo "triton $x exit $? at ${SECONDS}s"
  done
  fa-bench compare "$RUNS/tri-before" "$RUNS/tri-after" \
    --filter 'dtype=bf16,seqlen_q=1024|4096|16384' --markdown "$OUT/sweep-grid.md" \
    > "$OUT/sweep-grid.txt" 2>&1
  echo "compare before after (grid) exit $?"
  fa-bench compare "$RUNS/tri-before" "$RUNS/tri-after" --filter 'dtype=bf16' \
    --markdown "$OUT/sweep-bf16.md" > "$OUT/sweep-bf16.txt" 2>&1
  echo "compare before after (bf16) exit $?"
  tail -n 3 "$OUT/sweep-grid.txt" "$OUT/sweep-bf16.txt"
  tar czf "$OUT/tri-runs.tgz" "$RUNS/tri-before/results.json" "$RUNS/tri-after/results.json" \
    "$OUT"/tri-*.log "$OUT"/sweep-*.txt 2>/dev/null
  ;;
refactor-ab)
  # A change meant to alter no behaviour (issue 14): the standard bf16 grid of triton and
  # cuDNN, first with the tree in BASE=DIR (a checkout of the older commit, installed
  # editable over this one for the run), then with this tree, back to back, compared.
  base=${BASE:?BASE=DIR: a checkout of the commit to compare against}
  grid=(--suite standard --dtype bf16 --impl triton --impl sdpa-cudnn --tuning-cache off
    --no-telemetry --no-report)
  (cd "$base" && python3 -m pip install -q --no-deps --no-build-isolation -e .) || exit 1
  timeout -s INT 270 fa-bench run "${grid[@]}" --out "$RUNS/ab-before" > "$OUT/ab-before.log" 2>&1
  echo "before: exit $? at ${SECONDS}s"
  python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
  timeout -s INT 270 fa-bench run "${grid[@]}" --out "$RUNS/ab-after" > "$OUT/ab-after.log" 2>&1
  echo "after: exit $? at ${SECONDS}s"
  fa-bench compare "$RUNS/ab-before" "$RUNS/ab-after" --markdown "$OUT/ab.md" \
    > "$OUT/ab.txt" 2>&1
  echo "compare exit $?"
  tail -5 "$OUT/ab.txt"
  cp "$RUNS/ab-before/results.json" "$OUT/ab-before.json"
  cp "$RUNS/ab-after/results.json" "$OUT/ab-after.json"
  ;;
first)
  # One 10-minute call: the checks and short runs, then the standard suite until ~570 s.
  for phase in checks memory multigpu; do bash "$0" "$phase"; done
  BUDGET=$((560 - SECONDS)) bash "$0" standard
  # The device tool brings back at most 8 files: logs go back as one archive.
  (cd "$OUT" && tar czf logs.tgz --remove-files ./*.txt ./*.log multi-results.json)
  ;;
*)
  echo "usage: $0 checks|standard|telemetry|multigpu|memory|first|gate|warmup|sweep|sweep-ab|sweep-causal|heuristic|heuristic-fp32" >&2; exit 2 ;;
esac
