#!/bin/bash
# conv2 request 3 (final): the whole conv table with warm-ups before every timing (bench: 0.3 s
# of back-to-back runs per case; tuner: 0.15 s per shape class: request 2 showed the SM clock
# at 345-1140 MHz instead of 1980 for ~15 s of the table when the GPU had idle gaps), tuned
# from an empty cache (conv1 last), then the same table again in a fresh process from that
# cache, cuDNN f32 in the same call; SM clock logged.
T=/tmp/conv2; rm -rf $T; mkdir -p $T
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
date -u; ./tfwgpu-bench devices 2>&1 | head -4
timeout 230 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -lms 250 > $T/smi.txt 2>&1 &
SMI=$!
CASES=r50_56_1x1_64_64,r50_56_3x3_64_64,r50_56_3x3_64_64_b64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_28_1x1_512_128,r50_14_3x3_256_256,r50_14_3x3_256_256_b64,r50_14_1x1_1024_256,r50_7_3x3_512_512,r50_7_1x1_2048_512,dw_56_3x3_128,dw_14_3x3_512,r50_conv1
echo "== B: every case, tuned from an empty cache ($(date -u +%T.%N))"
TFWGPU_LOG="warn,tfwgpu_runtime::tune=info" timeout 110 ./tfwgpu-bench conv --cases $CASES --reps 3 --sample-ms 20 --detail --json $T/b-tuned.json 2>&1 | grep -v "^\s*$"
echo "== B2: the same, fresh process, from B's cache ($(date -u +%T.%N))"
timeout 60 ./tfwgpu-bench conv --cases $CASES --reps 3 --sample-ms 20 --json $T/b2-cached.json 2>&1 | grep -v "^\s*$"
echo "== torch conv f32 ($(date -u +%T.%N))"
timeout 45 python3 torch_conv.py --cases resnet50 --modes f32 --reps 5 --sample-ms 15 --json $T/torch.json 2>&1
kill $SMI 2>/dev/null
python3 - <<'PY'
import json, os, glob
T = "/tmp/conv2"; out = {}
for f in sorted(glob.glob(T + "/*.json")):
    try:
        out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        out[os.path.basename(f)] = str(e)
try:
    out["smi.txt"] = open(T + "/smi.txt").read().splitlines()
except Exception as e:
    out["smi.txt"] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
PY
echo "== smi (every 8th sample)"; awk 'NR % 8 == 1' $T/smi.txt | head -100
date -u
