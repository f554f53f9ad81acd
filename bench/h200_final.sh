#!/usr/bin/env bash
# One device call on the H200 for the merged tree (after bench/gpu_host.sh stage-tf 0..4):
# installs TensorFlow, then f32/f16 MatMul against PyTorch (with warm-up), Keras end to end
# (small models and ResNet-50) and PyTorch's ResNet-50 in the same call.
set -u
source .gl/activate.sh
bash bench/gpu_host.sh install-tf 5 2>&1 | tail -1
export TFWGPU_TUNE_CACHE=/tmp/tune.json
B=.hostrun/tfwgpu-bench
echo "== matmul vs torch"
CASES=matmul_1024,matmul_4096 OUT=$OUT/k BENCH=$B timeout 150 bash bench/h200_kernels.sh 2>&1 | tail -8
timeout 60 $B matmul --sizes 4096 --reps 5 --json $OUT/mm-f32.json 2>&1 | tail -2
timeout 60 $B matmul --dtype f16 --sizes 4096 --reps 5 --json $OUT/mm-f16.json 2>&1 | tail -2
echo "== keras"
bash bench/gpu_host.sh run 'timeout 150 python3 bench/keras_models.py --models resnet50 --resnet50-steps 8 --resnet50-warmup 2 --json $OUT/keras-r50.json 2>&1 | grep "batch"; timeout 80 python3 bench/keras_models.py --models mlp,cnn,resnet --json $OUT/keras-small.json 2>&1 | grep "batch"'
echo "== torch resnet50"
timeout 90 python3 bench/torch_models.py --models resnet50,cnn --modes f32 --layouts channels_last --steps 20 --warmup 5 --json $OUT/torch-models.json 2>&1 | tail -4
