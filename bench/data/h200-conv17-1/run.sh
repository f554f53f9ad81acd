#!/bin/bash
# conv17 request 1 (< 150 s): Conv2D float16 v7 (split model, head/tail split plans, v7 split
# sum, 16-subgroup filter-gradient tile) against v6b (same binary, env) and our float32, same
# call, every row of the conv16 table; then variants isolating each change.
#  N: f16 v7 defaults      B: f32 ours (fresh tune cache)      O: f16 v6b (env)
#  V1: v6b + v7 sum only   V2: v7 with the 8-subgroup wgrad tile   V3: v7 without head/tail
#  V4: wgrad split counts forced (7, 28)
T=/tmp/conv17; rm -rf $T; mkdir -p $T/bin
gunzip -c tfwgpu-bench.gz > $T/bin/tfwgpu-bench; chmod +x $T/bin/tfwgpu-bench
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
L=$OUT/log.txt
left() { echo $(( 140 - SECONDS )); }
{
date -u; timeout 10 $T/bin/tfwgpu-bench devices 2>&1 | head -4
timeout 142 nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 250 > $T/smi.txt 2>&1 &
SMI=$!
ROWS=wide,r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512
B=$T/bin/tfwgpu-bench
V6B="TFWGPU_CONV_COOP_SPLIT_MODEL=0 TFWGPU_CONV_COOP_SUM=8 TFWGPU_CONV_COOP_WGRAD=v6 TFWGPU_CONV_COOP_TAIL=0"
run() { # NAME MAX_SECONDS COMMAND...: at most MAX_SECONDS, never past the budget
  local name=$1 max=$2; shift 2
  local t=$(left); [ $t -gt $max ] && t=$max
  echo "== $name ($SECONDS s, limit $t s)"
  [ $t -gt 3 ] && timeout $t "$@" 2>&1 | grep -v "^\s*$"
}
run "N: f16 v7 defaults" 32 $B conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --detail --json $T/n-f16.json
run "B: f32 ours, tuned" 40 $B conv --dtype f32 --cases $ROWS --reps 3 --sample-ms 10 --json $T/b-f32.json
run "O: f16 v6b (env)" 30 env $V6B $B conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --detail --json $T/o-f16-v6b.json
run "V1: v6b + v7 split sum" 10 env TFWGPU_CONV_COOP_SPLIT_MODEL=0 TFWGPU_CONV_COOP_WGRAD=v6 TFWGPU_CONV_COOP_TAIL=0 $B conv --dtype f16 --cases $ROWS --ops bwd_filter --reps 3 --sample-ms 10 --detail --json $T/v1-sum.json
run "V2: v7, 8-subgroup wgrad tile" 8 env TFWGPU_CONV_COOP_WGRAD=v6 $B conv --dtype f16 --cases wide,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512 --ops bwd_filter --reps 3 --sample-ms 10 --detail --json $T/v2-tile8.json
run "V3: v7 without head/tail plans" 8 env TFWGPU_CONV_COOP_TAIL=0 $B conv --dtype f16 --cases wide,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_7_3x3_512_512 --reps 3 --sample-ms 10 --detail --json $T/v3-notail.json
run "V4a: wgrad 7 splits" 5 env TFWGPU_CONV_COOP_SPLITS=7 $B conv --dtype f16 --cases wide,r50_14_3x3_256_256,r50_7_3x3_512_512 --ops bwd_filter --reps 3 --sample-ms 10 --detail --json $T/v4a-s7.json
run "V4b: wgrad 28 splits" 5 env TFWGPU_CONV_COOP_SPLITS=28 $B conv --dtype f16 --cases wide,r50_14_3x3_256_256 --ops bwd_filter --reps 3 --sample-ms 10 --detail --json $T/v4b-s28.json
kill $SMI 2>/dev/null
echo "== smi (every 4th sample)"; awk 'NR % 4 == 1' $T/smi.txt | head -150
date -u
} > $L 2>&1
python3 - <<'PY'
import json, os, glob
T = "/tmp/conv17"; out = {}
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
PY
