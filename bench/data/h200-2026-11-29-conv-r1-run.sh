#!/bin/bash
# tune request 1: ResNet-50 conv cases, ours (auto = tuned: 1x1 on matmul kernels, implicit
# GEMM on the vector shader; gemm = the previous implicit-GEMM path) vs cuDNN f32/tf32;
# matmul 1024/4096 heuristic vs tuned; trusted vs checked conv shader.
T=/tmp/tune; mkdir -p $T
export TFWGPU_TUNE_CACHE=$T/tune-cache.json
./tfwgpu-bench devices 2>&1 | head -12
echo "== conv ours"
TFWGPU_LOG="warn,tfwgpu_runtime::tune=debug" timeout 120 ./tfwgpu-bench conv --cases resnet50 --tiles auto,gemm --reps 3 --sample-ms 40 --json $T/ours-conv.json 2>&1
echo "== conv checked (bounds checks on) vs trusted"
TFWGPU_CONV_CHECKED=1 timeout 15 ./tfwgpu-bench conv --cases r50_28_3x3_128_128,r50_14_3x3_256_256 --ops fwd,bwd_filter --tiles gemm --reps 3 --sample-ms 40 --json $T/ours-conv-checked.json 2>&1
echo "== torch conv"
timeout 50 python3 torch_conv.py --cases resnet50 --reps 5 --json $T/torch-conv.json 2>&1
echo "== matmul heuristic (TFWGPU_TUNE=0), then tuned"
TFWGPU_TUNE=0 timeout 15 ./tfwgpu-bench matmul --sizes 1024,4096 --reps 5 --json $T/ours-mm-heur.json 2>&1
TFWGPU_LOG="warn,tfwgpu_runtime::tune=debug" timeout 30 ./tfwgpu-bench matmul --sizes 1024,4096 --reps 5 --json $T/ours-mm-tuned.json 2>&1
timeout 15 python3 torch_ref.py --sizes 1024,4096 --reps 10 --json $T/torch-mm.json 2>&1
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
