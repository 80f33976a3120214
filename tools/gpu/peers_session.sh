#!/usr/bin/env bash
# The GPU checks of issues 15 and 17 on a two-H200 node (device kind nvidia-h200-x2), in
# phases sized for the device tool's 10-minute calls, run back to back while the machine
# stays warm (files under $HOME and fa-bench-out/ survive between them meanwhile).
#
#   bash tools/gpu/peers_session.sh fa4-a     # carry .fa4/a: FA4's small wheels to $HOME/fa4
#   bash tools/gpu/peers_session.sh fa4-b     # carry .fa4/b: the first half of the big one
#   bash tools/gpu/peers_session.sh main      # carry .fa4/c and .whl: install, env, gpu tests
#                                             #   of the peers, smoke --gpus all --spread, then
#                                             #   the standard bf16 run of fa4/cudnn/triton,
#                                             #   stopped by SIGTERM before the call's limit
#   bash tools/gpu/peers_session.sh finish    # --resume it, check fa4 against the anchors
#   bash tools/gpu/peers_session.sh xcheck    # instead of main (after fa4-a, fa4-b): fa4 in
#                                             #   fa-bench against do_bench on one GPU
#
# .fa4/ comes from ../shared/tools/fa4-wheels.sh, .whl/ from ../shared/tools/device-prep.sh.
set -u
export PYTHONUNBUFFERED=1 FA_BENCH_TUNING_CACHE=off COLUMNS=80
export PYTHONPATH=$HOME/fa4site:$HOME/fa4site/nvidia_cutlass_dsl/dsl_packages:$PWD/.site
OUT=${OUT:-fa-bench-out/out}
mkdir -p "$OUT" fa-bench-out
PEERS=(-s standard --dtype bf16 -i fa4 -i sdpa-cudnn -i triton --out fa-bench-out/peers)

install() {
  cat "$HOME/fa4/part.aa" .fa4/c/part.ab > "$HOME/fa4/$(cat .fa4/c/NAME)" && rm "$HOME/fa4/part.aa" \
    && python3 -m pip install -q --no-index --no-deps --target "$HOME/fa4site" "$HOME"/fa4/*.whl \
    && python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl \
    && python3 -m pip install -q --no-deps --no-build-isolation -e .
}

case "${1:-}" in
fa4-a) mkdir -p "$HOME/fa4" && cp .fa4/a/* "$HOME/fa4/" && ls "$HOME/fa4" ;;
fa4-b) cp .fa4/b/part.aa "$HOME/fa4/" && ls -la "$HOME/fa4" ;;
xcheck)
  install || exit 1
  python3 tools/gpu/fa4_crosscheck.py fa-bench-out/xcheck 2>&1 | grep -v Warning | tail -40 \
    | tee "$OUT/fa4_crosscheck.md"
  ;;
main)
  install || exit 1
  { fa-bench --version; fa-bench env | cat; fa-bench list impls | cat; } 2>&1 | tee "$OUT/env.log"
  fa-bench env --json > "$OUT/env.json"
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_peers.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
  start=$(date +%s)
  fa-bench run -s smoke --gpus all --spread --out fa-bench-out/spread 2>&1 | tee "$OUT/spread.log"
  echo "smoke --gpus all --spread: exit ${PIPESTATUS[0]}, $(($(date +%s) - start)) s" | tee -a "$OUT/spread.log"
  left=$((560 - SECONDS)); [ "$left" -lt 60 ] && left=60
  timeout -s TERM "$left" fa-bench run "${PEERS[@]}" > "$OUT/peers1.log" 2>&1
  echo "peers run: exit $? after ${left} s limit" | tee -a "$OUT/peers1.log"
  tail -5 "$OUT/peers1.log"
  ;;
finish)
  # A finished run resumes to nothing and is written again as it was.
  timeout -s TERM 480 fa-bench run --resume fa-bench-out/peers > "$OUT/peers2.log" 2>&1
  echo "resume: exit $?" | tee -a "$OUT/peers2.log"
  tail -40 "$OUT/peers2.log"
  python3 tools/gpu/fa4_vs_anchors.py fa-bench-out/peers | tee "$OUT/fa4_vs_anchors.md"
  fa-bench compare fa-bench-out/peers fa-bench-out/peers --markdown "$OUT/compare.md" 2>&1 | tail -8
  cp fa-bench-out/peers/results.json "$OUT/peers-results.json"
  cp fa-bench-out/peers/report.html "$OUT/peers-report.html" 2>/dev/null
  cp fa-bench-out/spread/results.json "$OUT/spread-results.json" 2>/dev/null
  ;;
*) echo "usage: $0 fa4-a|fa4-b|main|finish|xcheck" >&2; exit 2 ;;
esac
