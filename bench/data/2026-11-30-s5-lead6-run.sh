#!/usr/bin/env bash
# Lead, session 5, request 2: the tree with this session's fusion/reduce/upload changes on one
# H200 (TF installed beforehand): transfers, Keras end to end (ResNet-50 and the small
# models), ResNet-50 capture + replay, PyTorch in the same call.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== transfers"
timeout 40 $B transfer --mb 0.8,38.5 --reps 10 --json $OUT/transfer.json 2>&1 | tail -2
TFWGPU_UPLOAD_THREADS=1 timeout 40 $B transfer --mb 38.5 --reps 10 2>&1 | tail -1
echo "== keras"
bash bench/gpu_host.sh run 'timeout 170 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json $OUT/keras-r50.json 2>&1 | grep batch; timeout 90 python3 bench/keras_models.py --models mlp,cnn,resnet --json $OUT/keras-small.json 2>&1 | grep batch'
echo "== ResNet-50 capture + replay"
bash bench/gpu_host.sh run 'timeout 120 python3 bench/keras_models.py --models resnet50 --trace /tmp/tr --trace-steps 3 2>&1 | tail -1'
gzip -c /tmp/tr/resnet50.trace > $OUT/resnet50.trace.gz
timeout 100 $B replay /tmp/tr/resnet50.trace --repeat 3 --top 30 --json $OUT/replay-r50.json 2>&1 | grep -E "steps \"train_step\"|GPU busy|idle|^  [A-Z_]" | head -60
echo "== x2 MirroredStrategy, steady state"
bash bench/gpu_host.sh run 'bash bench/h200x2_mirrored.sh default'
echo "== torch"
timeout 80 python3 bench/torch_models.py --models resnet50,cnn --modes f32 --layouts channels_last --steps 20 --warmup 5 --json $OUT/torch-device.json 2>&1 | grep train
timeout 60 python3 bench/torch_models.py --models resnet50 --modes f32 --layouts channels_last --steps 20 --warmup 5 --feed pageable --json $OUT/torch-pageable.json 2>&1 | grep train
ls -la $OUT
