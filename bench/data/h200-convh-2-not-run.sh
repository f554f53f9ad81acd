#!/bin/bash
# convh request 2 (< 4 min): Conv2D float16 v5b (vector epilogue: 16-byte f16 stores;
# split-K sums 8 splits per invocation row; strided input gradients on cooperative matrices;
# 128 x 64 tiles up to 128 columns and for few 128 x 128 tiles) against our float32 in the
# same call, every op; forced tiles on a subset; PyTorch f16 again.
T=/tmp/convh; rm -rf $T; mkdir -p $T
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
L=$OUT/log.txt
left() { echo $(( 228 - SECONDS )); }
{
date -u; timeout 15 ./tfwgpu-bench devices 2>&1 | head -3
timeout 230 nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > $T/smi.txt 2>&1 &
SMI=$!
ALL=resnet,wide,r50_56_1x1_64_64,r50_56_3x3_64_64,r50_56_3x3_64_64_b64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_28_1x1_512_128,r50_14_3x3_256_256,r50_14_3x3_256_256_b64,r50_14_1x1_1024_256,r50_7_3x3_512_512,r50_7_1x1_2048_512
SUB=wide,r50_56_3x3_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512
run() { # NAME MAX_SECONDS COMMAND...: at most MAX_SECONDS, never past the budget
  local name=$1 max=$2; shift 2
  local t=$(left); [ $t -gt $max ] && t=$max
  echo "== $name ($SECONDS s, limit $t s)"
  [ $t -gt 6 ] && timeout $t "$@" 2>&1 | grep -v "^\s*$"
}
run "A1: f16 v5b auto fwd, bwd_input" 32 ./tfwgpu-bench conv --dtype f16 --cases $ALL --ops fwd,bwd_input --reps 3 --sample-ms 10 --json $T/a1-f16-v5b.json
run "A2: f16 v5b auto bwd_filter" 22 ./tfwgpu-bench conv --dtype f16 --cases $ALL --ops bwd_filter --reps 3 --sample-ms 10 --json $T/a2-f16-v5b.json
run "B: f32 ours, tuned" 60 ./tfwgpu-bench conv --dtype f32 --cases $ALL --reps 3 --sample-ms 10 --json $T/b-f32.json
for t in c128x64x64_4x2wg1fs c128x128x64_2x4wg1f c128x128x64_2x4wg1fs; do
  run "E: f16 $t" 20 ./tfwgpu-bench conv --dtype f16 --cases $SUB --reps 3 --sample-ms 10 --tiles $t --json $T/e-$t.json
done
run "C: torch f16" 25 python3 torch_conv_f16.py --cases $ALL --modes f16 --reps 5 --sample-ms 10 --json $T/c-torch.json
run "A3: f16 v5b auto fwd, bwd_input again" 30 ./tfwgpu-bench conv --dtype f16 --cases $ALL --ops fwd,bwd_input --reps 3 --sample-ms 10 --json $T/a3-f16-v5b.json
kill $SMI 2>/dev/null
echo "== smi (every 8th sample)"; awk 'NR % 8 == 1' $T/smi.txt | head -60
date -u
} > $L 2>&1
python3 - <<'PY'
import json, os, glob
T = "/tmp/convh"; out = {}
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
