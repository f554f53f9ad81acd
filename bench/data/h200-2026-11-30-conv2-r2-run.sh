#!/bin/bash
# conv2 request 2: (1) what slows every kernel 4-5x for ~20 s after ResNet's conv1 (request 1:
# GPU timestamps show the kernels themselves slow; not dedicated heaps): conv1's three passes
# each in a fresh process between 56x56 cases, GPU clocks / power / throttle reasons logged
# every 200 ms; (2) forced Winograd forward / input gradient vs the direct paths; (3) the whole
# table tuned from an empty cache with conv1 LAST; cuDNN f32 in the same call.
T=/tmp/conv2; rm -rf $T; mkdir -p $T
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
date -u; ./tfwgpu-bench devices 2>&1 | head -4
timeout 200 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,utilization.gpu,utilization.memory --format=csv,noheader -lms 200 > $T/smi.txt 2>&1 &
SMI1=$!
timeout 200 nvidia-smi --query-gpu=timestamp,clocks_throttle_reasons.active,clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.sw_power_cap,clocks_throttle_reasons.sw_thermal_slowdown,clocks_throttle_reasons.hw_power_brake_slowdown --format=csv,noheader -lms 200 > $T/smi-throttle.txt 2>&1 &
SMI2=$!
for ops in fwd bwd_input bwd_filter; do
  echo "== P-$ops: fresh process, TUNE=0: 56x56 3x3 (same pass), conv1 $ops, 56x56 3x3 x2 ($(date -u +%T.%N))"
  TFWGPU_TUNE=0 timeout 25 ./tfwgpu-bench conv --cases r50_56_3x3_64_64,r50_conv1,r50_56_3x3_64_64,r50_56_3x3_64_64 --ops $ops --reps 3 --sample-ms 20 --json $T/p-$ops.json 2>&1
  sleep 2
done
echo "== W: forced Winograd vs the direct path, forward and input gradient (TUNE=0) ($(date -u +%T.%N))"
TFWGPU_TUNE=0 timeout 30 ./tfwgpu-bench conv --cases r50_56_3x3_64_64,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_14_3x3_256_256_b64,r50_7_3x3_512_512 --ops fwd,bwd_input --tiles auto,winograd --reps 3 --sample-ms 20 --detail --json $T/w-wino.json 2>&1
echo "== B: every case, tuned from an empty cache, conv1 last ($(date -u +%T.%N))"
TFWGPU_LOG="warn,tfwgpu_runtime::tune=info" timeout 100 ./tfwgpu-bench conv --cases r50_56_1x1_64_64,r50_56_3x3_64_64,r50_56_3x3_64_64_b64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_28_1x1_512_128,r50_14_3x3_256_256,r50_14_3x3_256_256_b64,r50_14_1x1_1024_256,r50_7_3x3_512_512,r50_7_1x1_2048_512,dw_56_3x3_128,dw_14_3x3_512,r50_conv1 --reps 3 --sample-ms 20 --detail --json $T/b-tuned.json 2>&1 | grep -v "^\s*$"
echo "== torch conv f32 ($(date -u +%T.%N))"
timeout 45 python3 torch_conv.py --cases resnet50 --modes f32 --reps 5 --sample-ms 15 --json $T/torch.json 2>&1
kill $SMI1 $SMI2 2>/dev/null
python3 - <<'PY'
import json, os, glob
T = "/tmp/conv2"; out = {}
for f in sorted(glob.glob(T + "/*.json")):
    try:
        out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        out[os.path.basename(f)] = str(e)
for f in ["smi.txt", "smi-throttle.txt"]:
    try:
        out[f] = open(T + "/" + f).read().splitlines()
    except Exception as e:
        out[f] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
PY
echo "== smi (every 5th sample)"; awk 'NR % 5 == 1' $T/smi.txt | head -150
echo "== throttle (every 5th sample)"; awk 'NR % 5 == 1' $T/smi-throttle.txt | head -60
date -u
