#!/bin/bash
# conv2 request 1: GPU-timestamped conv table (per-kernel times), the 56x56 cases in fresh
# processes with and without tuning (the "slow stretch" question), the Winograd filter gradient
# forced and tuned, cuDNN f32 in the same call. Please run it alone on the GPU if you can.
T=/tmp/conv2; rm -rf $T; mkdir -p $T
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
smi() { echo "== nvidia-smi $1"; timeout 10 nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,utilization.gpu,memory.used --format=csv 2>&1 | tail -1; timeout 10 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | head -5; }
date -u; ./tfwgpu-bench devices 2>&1 | head -4
smi start
echo "== A: fresh process, TFWGPU_TUNE=0"
TFWGPU_TUNE=0 timeout 40 ./tfwgpu-bench conv --cases r50_56_1x1_64_64,r50_56_3x3_64_64,r50_conv1,dw_56_3x3_128,dw_14_3x3_512 --reps 3 --sample-ms 20 --detail --json $T/a-notune.json 2>&1
smi after-A
echo "== A2: filter gradients, heuristic direct vs forced Winograd (TFWGPU_TUNE=0)"
TFWGPU_TUNE=0 timeout 30 ./tfwgpu-bench conv --cases r50_56_3x3_64_64,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_14_3x3_256_256_b64,r50_7_3x3_512_512 --ops bwd_filter --tiles auto,winograd --reps 3 --sample-ms 20 --detail --json $T/a2-wino.json 2>&1
echo "== B: every case, tuned from an empty cache"
TFWGPU_LOG="warn,tfwgpu_runtime::tune=info" timeout 110 ./tfwgpu-bench conv --cases resnet50 --reps 3 --sample-ms 20 --detail --json $T/b-tuned.json 2>&1 | grep -v "^\s*$"
smi after-B
echo "== C: fresh process, cache from B"
timeout 25 ./tfwgpu-bench conv --cases r50_56_1x1_64_64,r50_56_3x3_64_64,r50_56_1x1_256_64,r50_28_3x3_128_128 --reps 3 --sample-ms 20 --json $T/c-cached.json 2>&1
echo "== D: the dedicated-heap hypothesis: TFWGPU_HEAP_MB=32 (outputs over 16 MB get a heap of their own, every run), TUNE=0"
TFWGPU_HEAP_MB=32 TFWGPU_TUNE=0 timeout 25 ./tfwgpu-bench conv --cases r50_28_3x3_128_128,r50_56_3x3_64_64,r50_28_3x3_128_128,r50_14_3x3_256_256 --ops fwd --reps 3 --sample-ms 20 --json $T/d-heap32.json 2>&1
echo "== torch conv f32"
timeout 45 python3 torch_conv.py --cases resnet50 --modes f32 --reps 5 --sample-ms 15 --json $T/torch.json 2>&1
smi end
python3 - <<'PY'
import json, os, glob
T = "/tmp/conv2"; out = {}
for f in sorted(glob.glob(T + "/*.json")):
    try:
        out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        out[os.path.basename(f)] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
PY
date -u
