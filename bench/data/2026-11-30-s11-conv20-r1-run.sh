#!/usr/bin/env bash
# conv20 request 1 (issue 6): the ceiling ladder of the float16 cooperative-matrix main loop
# on this driver, same tile as the 3x3 stride-1 products (`c128x128x64_4x4wg1fse8`: 16
# subgroups of 32 x 32, K tiles of 64 in one buffer, two barriers per K tile) and the
# 8-subgroup K-64 tile (`c128x128x64_2x4wg1fs`: 64 x 32 per subgroup), one output tile per
# workgroup (TFWGPU_CONV_COOP_SPLIT=0):
#   L0 = the product (global -> registers -> workgroup staging, fragment loads, products,
#        barriers); on r50_14 (3x3 windows) and on plain products of the same M, N, K
#        (gemm_14_1x1_2304_256): the gather's cost by difference;
#   L2 = no staging in the loop (fragment loads from workgroup memory + products + both
#        barriers); L3 = L2 without the barriers; L4 = products on register-resident
#        fragments only (TFWGPU_COOP_LADDER=2|3|4; their outputs are wrong by design, the
#        WRONG lines are expected there and only there).
# Per-K-tile cost and fixed part: the plain product at M = 6272 (98 tiles) with K = 576, 1152,
# 2304, 4608 (9..72 K tiles); the SM count: K = 2304 at 98, 132 and 264 tiles. Stream-K off/on
# on the plain 98-tile products and r50_14 (why it lost). Driver register counts of the ladder
# forms. Request folder: .hostrun/{tfwgpu-bench,tfwgpu-shader-stats} and this file as run.sh.
set -u
[ -f .gl/activate.sh ] && source .gl/activate.sh
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
B=${BENCH:-$PWD/.hostrun/tfwgpu-bench}
S=${STATS:-$PWD/.hostrun/tfwgpu-shader-stats}
T=/tmp/conv20; rm -rf $T; mkdir -p $T
L=$OUT/logs; mkdir -p $L
G=${G:-gemm_14_1x1_576_256,gemm_14_1x1_1152_256,gemm_14_1x1_2304_256,gemm_14_1x1_4608_256,gemm_16x33_1x1_2304_256,gemm_16x66_1x1_2304_256,r50_14_3x3_256_256}
TILES=${TILES:-c128x128x64_4x4wg1fse8,c128x128x64_2x4wg1fs}
SK=${SK:-gemm_14_1x1_2304_256,gemm_14_1x1_4608_256,r50_14_3x3_256_256}
REPS=${REPS:-3}
MS=${MS:-10}
LIM=${LIM:-40}
ROUNDS=${ROUNDS:-2}
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null
timeout 10 $B devices 2>&1 | head -4
for r in $(seq 1 $ROUNDS); do
  for v in 0 2 3 4 skoff skon; do
    left 190 || { echo "(time: skipped $v round $r)"; continue; }
    echo "== $v r$r $(date +%T) $(nvidia-smi --query-gpu=clocks.sm --format=csv,noheader 2>/dev/null)"
    case $v in
      sk*) e="TFWGPU_CONV_COOP_STREAMK=$([ $v = skon ] && echo 1 || echo 0)"; c=$SK; t=auto ;;
      *) e="TFWGPU_CONV_COOP_SPLIT=0 TFWGPU_COOP_LADDER=$v"; c=$G; t=$TILES ;;
    esac
    env $e TFWGPU_TUNE_CACHE=$T/tune-$v-$r.json timeout $LIM $B conv --dtype f16 --cases $c \
      --ops fwd --tiles $t --reps $REPS --sample-ms $MS --detail --json $L/$v-$r.json > $L/$v-$r.txt 2>&1
    echo "rc $?"; grep -cE "WRONG" $L/$v-$r.txt
  done
done
if left 200; then
  echo "== stats $(date +%T)"
  timeout 35 $S --filter _4x4wg1fse8_l32_akbn_w8x8_h,_2x4wg1fs_l32_akbn_w8x8_h > $L/stats.txt 2>&1
  echo "rc $?"; grep -c Register $L/stats.txt
fi
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s): median over rounds of busy ms (GPU timestamps) and TFLOP/s on busy"
python3 - "$L" <<'PY'
import json, glob, os, statistics, sys
L = sys.argv[1]
runs = {}
for f in sorted(glob.glob(L + "/*.json")):
    v = os.path.basename(f)[:-5].rsplit("-", 1)[0]
    try:
        d = json.load(open(f))
    except Exception as e:
        print("unreadable", f, e)
        continue
    for x in d.get("results", []):
        k = (v, x.get("tile", "auto"), x["case"])
        runs.setdefault(k, []).append((x.get("gpu_busy_ms"), x.get("ms"), x.get("tflops"), x.get("gpu_tflops"), x.get("rel_err"),
            " ".join(y.get("label", "").split(":")[-1] for y in x.get("kernels", []))))
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("%-6s %-24s %-24s %9s %9s %8s %9s %s" % ("var", "tile", "case", "busy ms", "wall ms", "TF busy", "rel err", "kernels"))
for k in sorted(runs):
    s = runs[k]
    busy = med([a for a, *_ in s if a]); wall = med([b for _, b, *_ in s if b])
    gt = med([g for *_, g, _, _ in s if g])
    print("%-6s %-24s %-24s %9.4f %9.4f %8.1f %9.1e %s" % (k[0], k[1], k[2], busy, wall, gt, s[-1][4] or 0, s[-1][5][:70]))
# Per-K-tile cost and fixed part per workgroup: busy = F + KT * t_k over the 98-tile products.
kt = {"gemm_14_1x1_576_256": 9, "gemm_14_1x1_1152_256": 18, "gemm_14_1x1_2304_256": 36, "gemm_14_1x1_4608_256": 72}
for v in ("0", "2", "3", "4"):
    for tile in sorted({k[1] for k in runs if k[0] == v}):
        pts = [(kt[c], med([a for a, *_ in runs[(v, tile, c)] if a])) for c in kt if (v, tile, c) in runs]
        if len(pts) >= 2:
            n = len(pts); mx = sum(x for x, _ in pts) / n; my = sum(y for _, y in pts) / n
            sl = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            print("fit L%s %-24s t_k %.3f us per K tile (%.1f TFLOP/s per SM-wave of 98), fixed %.1f us" % (
                v, tile, sl * 1e3, 98 * 2 * 128 * 128 * 64 / (sl * 1e-3) / 1e12, (my - sl * mx) * 1e3))
PY
