#!/usr/bin/env bash
# Lead, session 9, final call (x2 host, TF staged): the merged tree (mem5, conv17, host9, dual9;
# TFWGPU_SUBMIT_THREAD default on). Keras CNN end to end with PyTorch like for like interleaved
# (issue 7), the Keras/TensorFlow floor per step (keras_floor.py), two H200s with MirroredStrategy
# and the two-device replay (issue 8), Keras ResNet-50 with PyTorch (issue 7).
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l25.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
TK="timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants device,pageable+sync,infer"
KM="timeout 30 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
echo "== CNN: PyTorch / Keras default / Keras SUBMIT_THREAD=0, interleaved x3 $(date +%T)"
for r in 1 2 3; do
  echo "-- torch $r"; $TK --json $OUT/torch-$r.json 2>&1 | grep -E "ms/step"
  bash bench/gpu_host.sh run "echo '-- keras default $r'; $KM --json \$OUT/keras-cnn-$r.json 2>&1 | grep batch; echo '-- keras SUBMIT_THREAD=0 $r'; TFWGPU_SUBMIT_THREAD=0 $KM --json \$OUT/keras-cnn-st0-$r.json 2>&1 | grep batch"
done
echo "== Keras floor (Dense(1) fit, tf.function identity) on /GPU:0 and /CPU:0 $(date +%T)"
bash bench/gpu_host.sh run "timeout 60 python3 bench/keras_floor.py --steps 300 --json \$OUT/keras-floor.json 2>&1 | grep -E '^/'"
echo "== (two-GPU parts dropped: only the one-GPU host was lent for this call)"
if left 400; then
echo "== Keras ResNet-50 + PyTorch ResNet-50 $(date +%T)"
timeout 60 python3 bench/torch_models.py --models resnet50 --modes f32 --layouts channels_last --steps 30 --warmup 5 --feed pageable --json $OUT/torch-r50.json 2>&1 | grep -E "train" | head -2
bash bench/gpu_host.sh run "timeout 100 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json \$OUT/keras-r50.json 2>&1 | grep batch"
fi
if left 440; then
echo "== Keras ResNet-50, TFWGPU_SUBMIT_THREAD=0 $(date +%T)"
bash bench/gpu_host.sh run "TFWGPU_SUBMIT_THREAD=0 timeout 100 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json \$OUT/keras-r50-st0.json 2>&1 | grep batch"
fi
echo "== done $(date +%T)"; ls $OUT
