#!/usr/bin/env bash
# GV's last GPU call (issue 19 in the Gluon forward): the final code checked, then the
# targets measured. ~2.5 minutes on one H200:
#   1. tools/gpu/variants_gluon.py: the checks at bf16 and fp16 (every variant and
#      combination against float64 under the accuracy rule) and the four target shapes
#      timed beside the dense Gluon kernel, our `tl` kernel and flex, then softcap,
#      ALiBi and the window with tree-shaped row reductions and softcap with Q scaled
#      once per tile (development switches; the softcap checks also run with the latter);
#   2. fa-bench run of tools/gpu/variants_gluon_d.toml (`triton` only: its variant cases
#      and their dense controls, the backend naming the kernel), then the targets' table
#      (tools/gpu/variants_gluon_summary.py).
# Writes under $OUT (default fa-bench-out/out): variants_gluon.{md,json,log},
# variants_d/ (results.json, report.html), variants_d.log, summary.md.
set -u
OUT="${OUT:-fa-bench-out/out}"
mkdir -p "$OUT"
timeout 115 python tools/gpu/variants_gluon.py --dtypes bf16,fp16 --budget 100 \
  --row-timeout 25 --rows 9 --dev qscale > "$OUT/variants_gluon.log" 2>&1
echo "variants_gluon.py: exit $?"
timeout 55 fa-bench run -s tools/gpu/variants_gluon_d.toml -i triton --max-time 0.3 \
  -o "$OUT/variants_d" > "$OUT/variants_d.log" 2>&1
echo "fa-bench run: exit $?"
python tools/gpu/variants_gluon_summary.py "$OUT/variants_d/results.json" \
  "$OUT/variants_gluon.json" > "$OUT/summary.md" 2>&1
cat "$OUT/variants_gluon.md" "$OUT/summary.md"
