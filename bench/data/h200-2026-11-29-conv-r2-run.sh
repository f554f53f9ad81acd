#!/bin/bash
# tune request 2 (final): ResNet-50 conv cases with the col2im / im2col paths, tuned with the
# on-disk cache written from request 1's choices; cuDNN f32 in the same call; a small
# diagnostic of the 56x56 cases (heuristic tiles, fresh process, batch 64 before batch 32).
T=/tmp/tune; mkdir -p $T
cp tune-cache.json $T/tune-cache.json
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
./tfwgpu-bench devices 2>&1 | head -3
echo "== diag (TFWGPU_TUNE=0)"
TFWGPU_TUNE=0 timeout 20 ./tfwgpu-bench conv --cases r50_56_3x3_64_64_b64,r50_56_3x3_64_64,r50_28_3x3_128_128,r50_56_1x1_64_64 --ops fwd --reps 3 --sample-ms 30 --json $T/diag.json 2>&1
echo "== conv ours (tuned, cache from request 1)"
TFWGPU_LOG="warn,tfwgpu_runtime::tune=info" timeout 60 ./tfwgpu-bench conv --cases resnet50 --reps 3 --sample-ms 30 --json $T/ours-conv.json 2>&1
echo "== torch conv f32"
timeout 35 python3 torch_conv.py --cases resnet50 --modes f32 --reps 5 --sample-ms 15 --json $T/torch-conv.json 2>&1
python3 - <<'PY'
import json, os, glob
T = "/tmp/tune"; out = {}
for f in sorted(glob.glob(T + "/*.json")):
    try:
        out[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        out[os.path.basename(f)] = str(e)
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
PY
