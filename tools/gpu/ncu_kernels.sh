#!/usr/bin/env bash
# Nsight Compute's full section set on one call of each case (tools/gpu/ncu_target.py),
# with the clocks left alone (METHOD.md), then the reports as CSV: the details page, the
# raw metrics and the SASS source page with its per-instruction stall samples.
#   OUT=dir bash tools/gpu/ncu_kernels.sh NAME TARGET_ARGS... [-- NAME TARGET_ARGS...]
# e.g. bash tools/gpu/ncu_kernels.sh ours bwd triton-onepass bf16 128 16384 no
# A developer tool for the device machine (Firecracker runtime: ncu reads counters there).
set -u
OUT=${OUT:-ncu-out}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found" >&2; exit 1; }
"$NCU" --version | tail -1
name=$1; shift
rep="$OUT/$name"
"$NCU" --profile-from-start off --clock-control none --set full --import-source no \
  -f -o "$rep" python3 tools/gpu/ncu_target.py "$@" > "$OUT/$name.log" 2>&1
echo "$name: ncu exit $? ($(tail -2 "$OUT/$name.log" | tr '\n' ' '))"
"$NCU" -i "$rep.ncu-rep" --page details --csv > "$OUT/${name}_details.csv" 2>&1
"$NCU" -i "$rep.ncu-rep" --page raw --csv > "$OUT/${name}_raw.csv" 2>&1
"$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass \
  > "$OUT/${name}_sass.csv" 2>"$OUT/${name}_sass.err"
# the CSVs hold what is read here; the report itself comes back only when asked (size)
[ "${KEEP_REP:-0}" = 1 ] || rm -f "$rep.ncu-rep"
ls -la "$OUT" | grep "$name"
