#!/usr/bin/env bash
# conv19 request 1 (issue 6; not run in session 10, ready for the next session): float16
# Conv2D stream-K (`TFWGPU_CONV_COOP_STREAMK=1`, commit 61466f7 of branch conv19: one wave of
# 132 workgroups over the (output tile, K tile) iterations, partial tiles summed in K order by
# each tile's last arrival) against the default plans (v8b: head/tail in one launch) and our
# float32, on the rows where the waves are uneven: r50_14 (98 tiles, no full wave), r50_7
# (52 tiles), wide and r50_28 (196 tiles), forward and input gradient. Three rounds, the
# variants interleaved in each (separate processes, a fresh tune cache per run):
#   off = f16 defaults, on = f16 TFWGPU_CONV_COOP_STREAMK=1, f32 = our float32 (tuned).
# The bench checks every row against its reference (WRONG lines count them). Request folder:
# .hostrun/tfwgpu-bench (release, stripped, of 61466f7 or later on conv19) and this script as
# run.sh. ~150 s (each run capped; the budget stops new runs at 200 s).
set -u
[ -f .gl/activate.sh ] && source .gl/activate.sh
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
B=${BENCH:-$PWD/.hostrun/tfwgpu-bench}
T=/tmp/conv19; rm -rf $T; mkdir -p $T
L=$OUT/logs; mkdir -p $L
CASES=${CASES:-r50_14_3x3_256_256,r50_7_3x3_512_512,wide,r50_28_3x3_128_128}
OPS=${OPS:-fwd,bwd_input}
REPS=${REPS:-3}
MS=${MS:-10}
LIM=${LIM:-25}
ROUNDS=${ROUNDS:-3}
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null
timeout 10 $B devices 2>&1 | head -4
V_off=""
V_on="TFWGPU_CONV_COOP_STREAMK=1"
for r in $(seq 1 $ROUNDS); do
  for v in off on f32; do
    left 200 || { echo "(time: skipped $v round $r)"; continue; }
    if [ $v = f32 ]; then e=""; dt=f32; det=""; else eval "e=\$V_$v"; dt=f16; det="--detail"; fi
    echo "== $v r$r $(date +%T)"
    env $e TFWGPU_TUNE_CACHE=$T/tune-$v-$r.json timeout $LIM $B conv --dtype $dt --cases $CASES \
      --ops $OPS --reps $REPS --sample-ms $MS $det --json $L/$v-$r.json > $L/$v-$r.txt 2>&1
    echo "rc $?"; grep -E "WRONG|error" $L/$v-$r.txt | head -5
  done
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s): median over rounds of each run's ms (wall) / busy ms"
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
    items = d.get("results", d.get("rows", [])) if isinstance(d, dict) else d
    for x in items:
        k = (x["case"], x["op"])
        runs.setdefault(v, {}).setdefault(k, []).append((x.get("ms"), x.get("gpu_busy_ms"),
            [y.get("label", "") for y in x.get("kernels", [])]))
med = lambda xs: statistics.median(xs) if xs else None
keys = sorted(set().union(*[set(r) for r in runs.values()])) if runs else []
print("%-22s %-9s %-17s %-17s %-17s %-6s %-6s %s" % ("case", "op", "off ms/busy", "on ms/busy", "f32 ms/busy", "off x", "on x", "on kernels"))
for k in keys:
    cell, ms = [], {}
    for v in ("off", "on", "f32"):
        s = runs.get(v, {}).get(k, [])
        w = med([a for a, _, _ in s if a]); b = med([b for _, b, _ in s if b])
        ms[v] = w
        cell.append("-" if w is None else "%.4f/%s" % (w, "-" if b is None else "%.4f" % b))
    ratio = lambda v: "-" if not ms.get(v) or not ms.get("f32") else "%.2f" % (ms["f32"] / ms[v])
    labels = sorted({l for _, _, ls in runs.get("on", {}).get(k, []) for l in ls if "matmul_coop" in l or "coop" in l})
    print("%-22s %-9s %-17s %-17s %-17s %-6s %-6s %s" % (k[0], k[1], *cell, ratio("off"), ratio("on"), " ".join(l.split(":")[-1] for l in labels)[:80]))
PY
