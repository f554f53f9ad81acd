#!/usr/bin/env bash
# conv20 request 2 (issue 6): the staging's cost on the 3x3 stride-1 rows. Request 1's ladder
# put ~0.41 us of each K tile's ~1.1 us (16-subgroup tile, r50_14) in the staging (global
# loads, unpacking, workgroup stores): the 16-byte loads are `vec4<u32>` words unpacked with
# unpack2x16float and f16() per half (32 conversions per invocation and K tile). Variants,
# interleaved in three rounds (separate processes, a fresh tune cache per run):
#   def = float16 defaults (v8b plans; 16-subgroup `c128x128x64_4x4wg1fse8`);
#   M   = the same tile and plans with the 16-byte loads typed `mat2x4<f16>` (no conversion:
#         `c128x128x64_4x4mg1fse8`, new);
#   V   = the same tile with 8-byte `vec4<f16>` loads (no conversion, twice the loads:
#         `c128x128x64_4x4vg1fse8`);
#   f32 = our float32 (tuned).
# Rows: forward and input gradient of r50_14, r50_28, wide, r50_7. Then the driver's register
# counts of the M tile and of the stream-K / head-tail forms. Request folder:
# .hostrun/{tfwgpu-bench,tfwgpu-shader-stats} and this file as run.sh. ~150 s.
set -u
[ -f .gl/activate.sh ] && source .gl/activate.sh
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
B=${BENCH:-$PWD/.hostrun/tfwgpu-bench}
S=${STATS:-$PWD/.hostrun/tfwgpu-shader-stats}
T=/tmp/conv20b; rm -rf $T; mkdir -p $T
L=$OUT/logs; mkdir -p $L
CASES=${CASES:-r50_14_3x3_256_256,r50_28_3x3_128_128,wide,r50_7_3x3_512_512}
OPS=${OPS:-fwd,bwd_input}
REPS=${REPS:-3}
MS=${MS:-10}
LIM=${LIM:-40}
ROUNDS=${ROUNDS:-3}
TM=${TM:-c128x128x64_4x4mg1fse8}
TV=${TV:-c128x128x64_4x4vg1fse8}
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null
timeout 10 $B devices 2>&1 | head -4
for r in $(seq 1 $ROUNDS); do
  for v in def M V f32; do
    left 175 || { echo "(time: skipped $v round $r)"; continue; }
    case $v in
      f32) dt=f32; det=""; t=auto ;;
      M) dt=f16; det="--detail"; t=$TM ;;
      V) dt=f16; det="--detail"; t=$TV ;;
      *) dt=f16; det="--detail"; t=auto ;;
    esac
    echo "== $v r$r $(date +%T) $(nvidia-smi --query-gpu=clocks.sm --format=csv,noheader 2>/dev/null)"
    TFWGPU_TUNE_CACHE=$T/tune-$v-$r.json timeout $LIM $B conv --dtype $dt --cases $CASES \
      --ops $OPS --tiles $t --reps $REPS --sample-ms $MS $det --json $L/$v-$r.json > $L/$v-$r.txt 2>&1
    echo "rc $?"; grep -E "WRONG|error" $L/$v-$r.txt | head -5
  done
done
if left 195; then
  echo "== stats $(date +%T)"
  timeout 35 $S --filter conv_c128x128x64_4x4wg1fse8_l32_akbn_w8x8_h,conv_${TM}_l32_akbn_w8x8_h_vo,conv_${TV}_l32_akbn_w4x4_h_vo > $L/stats.txt 2>&1
  echo "rc $?"; grep -c Register $L/stats.txt
fi
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s): median over rounds of each run's wall ms / busy ms; x = our f32 wall / wall"
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
        runs.setdefault(v, {}).setdefault((x["case"], x["op"]), []).append(
            (x.get("ms"), x.get("gpu_busy_ms"), x.get("rel_err"),
             " ".join(y.get("label", "").split(":")[-1] for y in x.get("kernels", []))))
med = lambda xs: statistics.median(xs) if xs else None
vs = ("def", "M", "V", "f32")
keys = sorted(set().union(*[set(r) for r in runs.values()])) if runs else []
print("%-20s %-9s " % ("case", "op") + " ".join("%-17s" % (v + " ms/busy") for v in vs) + " def x  M x    V x    M err")
for k in keys:
    cell, ms = [], {}
    for v in vs:
        s = runs.get(v, {}).get(k, [])
        w = med([a for a, *_ in s if a]); b = med([b for _, b, *_ in s if b])
        ms[v] = w
        cell.append("%-17s" % ("-" if w is None else "%.4f/%s" % (w, "-" if b is None else "%.4f" % b)))
    ratio = lambda v: "-" if not ms.get(v) or not ms.get("f32") else "%.2f" % (ms["f32"] / ms[v])
    err = runs.get("M", {}).get(k, [(None, None, None, "")])[-1][2]
    print("%-20s %-9s " % k + " ".join(cell) + " %-6s %-6s %-6s %s" % (ratio("def"), ratio("M"), ratio("V"), "-" if err is None else "%.1e" % err))
for v in ("def", "M", "V"):
    labels = sorted({s[3] for r in runs.get(v, {}).values() for s in r})
    print(v, "kernels:", " | ".join(labels)[:400])
PY
