#!/usr/bin/env bash
# Lead, session 5, request 3 (x2 host, TF installed): the merged tree. Keras ResNet-50 and
# the small models end to end, ResNet-50 capture + replay (and with two batching settings),
# PyTorch ResNet-50 in the same call, two H200s steady state (default and two settings).
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== keras"
bash bench/gpu_host.sh run 'timeout 170 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json $OUT/keras-r50.json 2>&1 | grep batch; timeout 90 python3 bench/keras_models.py --models mlp,cnn,resnet --json $OUT/keras-small.json 2>&1 | grep batch'
echo "== ResNet-50 capture + replay"
bash bench/gpu_host.sh run 'timeout 120 python3 bench/keras_models.py --models resnet50 --trace /tmp/tr --trace-steps 3 2>&1 | tail -1'
gzip -c /tmp/tr/resnet50.trace > $OUT/resnet50.trace.gz
timeout 100 $B replay /tmp/tr/resnet50.trace --repeat 3 --top 30 --json $OUT/replay-r50.json 2>&1 | grep -E "steps \"train_step\"|steps \"infer_step\"|GPU busy|idle \(medians\)|^  [A-Z_]" | head -70
for e in TFWGPU_BATCH_IDLE_OPS=4 TFWGPU_BATCH_US=100; do echo "== replay $e"; env $e timeout 100 $B replay /tmp/tr/resnet50.trace --repeat 3 --json $OUT/replay-r50-${e#TFWGPU_}.json 2>&1 | grep -E "steps \"train_step\"" | head -3; done
echo "== depthwise forward (four output columns per invocation) vs cuDNN"
timeout 60 $B conv --cases dw_14_3x3_512,dw_56_3x3_128 --ops fwd --reps 5 --json $OUT/conv-dw.json 2>&1 | tail -4
timeout 60 python3 bench/torch_conv.py --cases dw_14_3x3_512,dw_56_3x3_128 --ops fwd --modes f32 --json $OUT/torch-conv-dw.json 2>&1 | tail -3
echo "== MatMul f16 (tensor cores) and f32, 4096, merged tree"
timeout 40 $B matmul --dtype f16 --sizes 4096 --reps 5 --json $OUT/mm-f16.json 2>&1 | tail -2
timeout 40 $B matmul --sizes 4096 --reps 5 --json $OUT/mm-f32.json 2>&1 | tail -2
echo "== torch"
timeout 60 python3 bench/torch_models.py --models resnet50 --modes f32 --layouts channels_last --steps 15 --warmup 5 --json $OUT/torch-models.json 2>&1 | grep train
echo "== x2 MirroredStrategy, steady state"
bash bench/gpu_host.sh run 'bash bench/h200x2_mirrored.sh default; for e in TFWGPU_BATCH_IDLE_OPS=1 TFWGPU_BATCH_US=100; do echo "== $e"; env $e timeout 170 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $OUT/mirrored-${e#TFWGPU_}.json 2>&1 | grep -E "images_per_s\"|speedup|step_ms_mean"; done'
ls -la $OUT
