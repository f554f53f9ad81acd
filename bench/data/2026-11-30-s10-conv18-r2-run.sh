#!/bin/bash
# conv18 request 2 (< 200 s): Conv2D float16 v8b (head/tail plans in one launch, the tail's
# splits summed by their last arrivals, also for forward / input gradient; split sums in the
# epilogue) against our float32, v8 (request 1's, TFWGPU_CONV_COOP_ONE_LAUNCH=0) and v7b
# (TFWGPU_CONV_COOP_LAST=0), same binary, every row of the conv17 table, in one call.
#  N1/N2: f16 v8b defaults   B1/B2: f32 ours (fresh tune cache)   T: v8 (two launches)   O: v7b
[ -f .gl/activate.sh ] && source .gl/activate.sh
T=/tmp/conv18; rm -rf $T; mkdir -p $T
B=${BENCH:-$PWD/.hostrun/tfwgpu-bench}
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
L=$OUT/log.txt
BUDGET=${BUDGET:-205}
left() { echo $(( BUDGET - SECONDS )); }
ROWS=${ROWS:-wide,r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512}
ROWS3=${ROWS3:-wide,r50_28_3x3_128_128,r50_14_3x3_256_256}
REPS=${REPS:-3}
MS=${MS:-10}
{
date -u; timeout 10 $B devices 2>&1 | head -4
timeout $((BUDGET + 5)) nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 250 > $T/smi.txt 2>&1 &
SMI=$!
run() { # NAME MAX_SECONDS COMMAND...: at most MAX_SECONDS, never past the budget
  local name=$1 max=$2; shift 2
  local t=$(left); [ $t -gt $max ] && t=$max
  echo "== $name ($SECONDS s, limit $t s)"
  [ $t -gt 3 ] && timeout $t "$@" 2>&1 | grep -v "^\s*$"
}
run "N1: f16 v8b defaults" 34 $B conv --dtype f16 --cases $ROWS --reps $REPS --sample-ms $MS --detail --json $T/n1-f16.json
run "B1: f32 ours, tuned" 42 $B conv --dtype f32 --cases $ROWS --reps $REPS --sample-ms $MS --json $T/b1-f32.json
run "T: f16 ONE_LAUNCH=0 (v8)" 30 env TFWGPU_CONV_COOP_ONE_LAUNCH=0 $B conv --dtype f16 --cases $ROWS --reps $REPS --sample-ms $MS --detail --json $T/t-f16-v8.json
run "O: f16 LAST=0 (v7b)" 30 env TFWGPU_CONV_COOP_LAST=0 $B conv --dtype f16 --cases $ROWS --reps $REPS --sample-ms $MS --detail --json $T/o-f16-v7b.json
run "N2: f16 v8b defaults" 30 $B conv --dtype f16 --cases $ROWS --reps $REPS --sample-ms $MS --json $T/n2-f16.json
run "B2: f32 ours, tuned" 40 $B conv --dtype f32 --cases $ROWS --reps $REPS --sample-ms $MS --json $T/b2-f32.json
kill $SMI 2>/dev/null
echo "== smi (every 4th sample)"; awk 'NR % 4 == 1' $T/smi.txt | head -200
date -u
} > $L 2>&1
python3 - <<'PY'
import json, os, glob
T = "/tmp/conv18"; out = {}
for f in sorted(glob.glob(T + "/*.json")):
    try:
        out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        out[os.path.basename(f)] = str(e)
try:
    out["smi.txt"] = open(T + "/smi.txt").read().splitlines()
except Exception as e:
    out["smi.txt"] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"))
# Summary: median wall ms per (case, op) of every run, and f16 / f32 ratios.
def rows(name):
    d = out.get(name)
    res = {}
    if not isinstance(d, (dict, list)):
        return res
    items = d.get("results", d.get("rows", [])) if isinstance(d, dict) else d
    for r in items if isinstance(items, list) else []:
        try:
            res[(r["case"], r["op"])] = r.get("ms")
        except Exception:
            pass
    return res
runs = {k: rows(k) for k in ["n1-f16", "b1-f32", "t-f16-v8", "o-f16-v7b", "n2-f16", "b2-f32"]}
keys = sorted(set().union(*[set(v) for v in runs.values()])) if runs else []
print("case op " + " ".join(runs))
for k in keys:
    vals = [runs[r].get(k) for r in runs]
    print(k[0], k[1], " ".join("-" if v is None else "%.4f" % v for v in vals))
PY
tail -3 $L
