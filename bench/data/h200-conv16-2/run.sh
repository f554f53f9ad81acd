#!/bin/bash
# conv16 request 2 (< 2 min): the final defaults (v6: strided input gradients by output
# phase, one launch for the phases; 16-subgroup 128 x 128 tiles for the windowed products of
# 128+ columns; 64 x 64 for the 1x1 64 -> 64 products; the bench's untimed samples until the
# allocator stops growing) against our float32 Conv2D in the same call, every row of
# RESULTS's session-7 table; then the phase variants.
#  N: f16 auto   B: f32 ours (fresh tune cache)   V: variants
T=/tmp/conv16; rm -rf $T; mkdir -p $T/bin
gunzip -c tfwgpu-bench.gz > $T/bin/tfwgpu-bench; chmod +x $T/bin/tfwgpu-bench
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
L=$OUT/log.txt
left() { echo $(( 112 - SECONDS )); }
{
date -u; timeout 10 $T/bin/tfwgpu-bench devices 2>&1 | head -3
timeout 114 nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 250 > $T/smi.txt 2>&1 &
SMI=$!
ROWS=wide,r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512
S2=r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2
B=$T/bin/tfwgpu-bench
run() { # NAME MAX_SECONDS COMMAND...: at most MAX_SECONDS, never past the budget
  local name=$1 max=$2; shift 2
  local t=$(left); [ $t -gt $max ] && t=$max
  echo "== $name ($SECONDS s, limit $t s)"
  [ $t -gt 4 ] && timeout $t "$@" 2>&1 | grep -v "^\s*$"
}
run "N: f16 auto (conv16 final)" 32 $B conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --detail --json $T/n-f16.json
run "B: f32 ours, tuned" 45 $B conv --dtype f32 --cases $ROWS --reps 3 --sample-ms 10 --json $T/b-f32.json
run "V1: phases, one launch per phase" 7 env TFWGPU_CONV_COOP_PHASE_MERGE=0 $B conv --dtype f16 --cases $S2 --ops bwd_input --reps 3 --sample-ms 10 --detail --json $T/v1-sep.json
run "V2: phase tiles" 9 $B conv --dtype f16 --cases $S2 --ops bwd_input --tiles c128x64x64_4x2wg1f,c128x128x64_2x4wg1f --reps 3 --sample-ms 10 --json $T/v2-tiles.json
run "V3: v5b strided windows" 7 env TFWGPU_CONV_COOP_PHASES=0 $B conv --dtype f16 --cases $S2 --ops bwd_input --reps 3 --sample-ms 10 --json $T/v3-v5b.json
kill $SMI 2>/dev/null
echo "== smi (every 4th sample)"; awk 'NR % 4 == 1' $T/smi.txt | head -120
date -u
} > $L 2>&1
python3 - <<'PY'
import json, os, glob
T = "/tmp/conv16"; out = {}
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
