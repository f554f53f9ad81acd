#!/bin/bash
# conv17 request 2 (< 120 s): Conv2D float16 v7b final defaults against our float32 and v6b
# (same binary, env) in the same call, every row of the conv16 table; two splits summed in
# pairs against the split sum (r50_7 forward / input gradient).
#  N: f16 v7b defaults    B: f32 ours (fresh tune cache)    O: f16 v6b (env)    P: v7b, pairs off
T=/tmp/conv17; rm -rf $T; mkdir -p $T/bin
gunzip -c tfwgpu-bench.gz > $T/bin/tfwgpu-bench; chmod +x $T/bin/tfwgpu-bench
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
L=$OUT/log.txt
left() { echo $(( 112 - SECONDS )); }
{
date -u; timeout 10 $T/bin/tfwgpu-bench devices 2>&1 | head -4
timeout 114 nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 250 > $T/smi.txt 2>&1 &
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
run "N: f16 v7b defaults" 32 $B conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --detail --json $T/n-f16.json
run "B: f32 ours, tuned" 40 $B conv --dtype f32 --cases $ROWS --reps 3 --sample-ms 10 --json $T/b-f32.json
run "O: f16 v6b (env)" 28 env $V6B $B conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --json $T/o-f16-v6b.json
run "P: v7b without pair sums" 6 env TFWGPU_CONV_COOP_PAIR=0 $B conv --dtype f16 --cases r50_7_3x3_512_512 --ops fwd,bwd_input --reps 3 --sample-ms 10 --detail --json $T/p-nopair.json
kill $SMI 2>/dev/null
echo "== smi (every 4th sample)"; awk 'NR % 4 == 1' $T/smi.txt | head -120
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
