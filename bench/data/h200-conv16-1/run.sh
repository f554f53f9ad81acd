#!/bin/bash
# conv16 request 1 (< 4 min): Conv2D float16 (coop) against our float32 Conv2D, same call,
# on the RESULTS session-7 rows, main's binary and conv16's (v6: strided input gradients by
# output phase); diagnostics for the 56x56 1x1 forward rows; window cost; tiles; registers.
#  A: f16 auto, main's binary         N: f16 auto, conv16 binary    B: f32 ours (fresh tune cache)
#  P: strided rows, v6 variants (zeros: fill = default, kernel, clear; tiles; v5b)      G: plain products with the 3x3 layers' M, N, K
#  C: 1x1 fwd diagnostics (op order, repeats, heap size; per-sample times in the JSON)
#  D: forced tiles                    S: driver register counts of the conv forms
T=/tmp/conv16; rm -rf $T; mkdir -p $T/bin
for b in tfwgpu-bench tfwgpu-bench-new tfwgpu-shader-stats; do gunzip -c $b.gz > $T/bin/$b; chmod +x $T/bin/$b; done
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
L=$OUT/log.txt
left() { echo $(( 229 - SECONDS )); }
{
date -u; timeout 15 $T/bin/tfwgpu-bench devices 2>&1 | head -8
timeout 232 nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 200 > $T/smi.txt 2>&1 &
SMI=$!
ROWS=wide,r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512
S2=r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2
NEW=$T/bin/tfwgpu-bench-new
run() { # NAME MAX_SECONDS COMMAND...: at most MAX_SECONDS, never past the budget
  local name=$1 max=$2; shift 2
  local t=$(left); [ $t -gt $max ] && t=$max
  echo "== $name ($SECONDS s, limit $t s)"
  [ $t -gt 6 ] && timeout $t "$@" 2>&1 | grep -v "^\s*$"
}
run "A: f16 auto (main 7e9bfcc)" 30 $T/bin/tfwgpu-bench conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --detail --json $T/a-f16-main.json
run "N: f16 auto (conv16 v6)" 30 $NEW conv --dtype f16 --cases $ROWS --reps 3 --sample-ms 10 --detail --json $T/n-f16-v6.json
run "B: f32 ours, tuned" 70 $NEW conv --dtype f32 --cases $ROWS --reps 3 --sample-ms 10 --json $T/b-f32.json
run "P1: phases, zeros by kernel" 7 env TFWGPU_CONV_COOP_PHASE_ZEROS=kernel $NEW conv --dtype f16 --cases r50_56_1x1_256_128_s2 --ops bwd_input --reps 5 --sample-ms 10 --detail --json $T/p1-zk.json
run "P1b: phases, zeros by a clear" 7 env TFWGPU_CONV_COOP_PHASE_ZEROS=clear $NEW conv --dtype f16 --cases r50_56_1x1_256_128_s2 --ops bwd_input --reps 5 --sample-ms 10 --detail --json $T/p1b-zc.json
run "P0: phases, forced tiles" 10 $NEW conv --dtype f16 --cases $S2 --ops bwd_input --tiles c128x128x64_2x4wg1f,c64x64x64_2x2w1fs --reps 3 --sample-ms 10 --detail --json $T/p0-tiles.json
run "P2: v5b strided windows" 9 env TFWGPU_CONV_COOP_PHASES=0 $NEW conv --dtype f16 --cases $S2 --ops bwd_input --reps 3 --sample-ms 10 --json $T/p2-v5b.json
run "G: plain products of the 3x3 shapes" 10 $NEW conv --dtype f16 --cases gemm_28_1x1_1152_128,gemm_14_1x1_2304_256,gemm_7_1x1_4608_512 --ops fwd --reps 3 --sample-ms 10 --detail --json $T/g-gemm.json
run "C1: 1x1 fwd, op order" 12 $NEW conv --dtype f16 --cases r50_56_1x1_64_256,r50_56_1x1_64_64,r50_56_1x1_64_256 --ops fwd,bwd_input,fwd --reps 5 --sample-ms 10 --detail --json $T/c1-order.json
run "C2: 1x1 fwd, 1 GiB heaps" 7 env TFWGPU_HEAP_MB=1024 $NEW conv --dtype f16 --cases r50_56_1x1_64_256 --ops fwd,fwd --reps 5 --sample-ms 10 --json $T/c2-heap.json
run "D: f16 tiles" 18 $NEW conv --dtype f16 --cases r50_56_1x1_64_64,r50_56_1x1_64_256,r50_28_3x3_128_128,r50_14_3x3_256_256 --ops fwd,bwd_input --tiles c128x64x64_4x2wg1f,c128x128x64_2x4wg1f,c64x64x64_2x2w1fs,c128x128x64_4x4wg1fse8 --reps 3 --sample-ms 10 --json $T/d-tiles.json
run "S: driver statistics" 15 $T/bin/tfwgpu-shader-stats --filter coop_c128x64x64_4x2wg1f_,coop_conv_c128x64x64_4x2wg1f_,coop_convbi_c128x64x64_4x2wg1f_,coop_c128x128x64_2x4wg1f_,coop_conv_c128x128x64_2x4wg1f_
kill $SMI 2>/dev/null
echo "== smi (every 5th sample)"; awk 'NR % 5 == 1' $T/smi.txt | head -120
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
