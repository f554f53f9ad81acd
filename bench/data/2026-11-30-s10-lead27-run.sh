#!/usr/bin/env bash
# Lead, session 10, final call (x2 host, TF staged): the merged tree (mem6, dual10, conv18,
# host10 at a98e2c4). Keras CNN end to end with PyTorch like for like interleaved, the default
# against TFWGPU_SUBMIT_THREAD=1, and TensorFlow's floor per step (issue 7); two H200s:
# MirroredStrategy and the data-parallel replay (issue 8); Keras ResNet-50 with PyTorch (issue
# 7). Run from the checkout root with .hostrun/ (plugin + bench). Parts skipped past ~330 s.
set -u
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-l27.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
TK="timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
KM="timeout 30 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
echo "== CNN: PyTorch / Keras default / Keras TFWGPU_SUBMIT_THREAD=1, interleaved x3 $(date +%T)"
for r in 1 2 3; do
  echo "-- torch $r"; $TK --json $OUT/torch-$r.json 2>&1 | grep -E "ms/step"
  bash bench/gpu_host.sh run "echo -n 'keras default $r: '; $KM --json \$OUT/keras-cnn-$r.json 2>&1 | grep batch; echo -n 'keras SUBMIT_THREAD=1 $r: '; TFWGPU_SUBMIT_THREAD=1 $KM --json \$OUT/keras-cnn-st1-$r.json 2>&1 | grep batch"
done
echo "== Keras floor (Dense(1) fit, tf.function identity) on /GPU:0 and /CPU:0, default then SUBMIT_THREAD=1 (GPU) $(date +%T)"
bash bench/gpu_host.sh run "timeout 50 python3 bench/keras_floor.py --steps 300 --json \$OUT/keras-floor.json 2>&1 | grep -E '^/'; TFWGPU_SUBMIT_THREAD=1 timeout 30 python3 bench/keras_floor.py --devices /GPU:0 --steps 300 --json \$OUT/keras-floor-st1.json 2>&1 | grep -E '^/'"
if left 250 && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  echo "== two H200s: mirrored.py (default all-reduce) $(date +%T)"
  bash bench/gpu_host.sh run "timeout 45 python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json \$OUT/mirrored.json 2>&1 | grep -E '\"images_per_s\"|\"speedup\"|step_ms_median' | tr -s ' ' | tr '\n' ' '"; echo
  echo "== two H200s: data-parallel replay, exchange and none $(date +%T)"
  zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/l27.trace
  for m in exchange none; do
    timeout 25 $B replay /tmp/l27.trace --data-parallel 1,2 --per-device-batch 256 --repeat 11 --allreduce $m --json $OUT/dp-$m.json 2>&1 | grep -E "step median|all-reduce [a-z]+,"
  done
fi
if left 230; then
  echo "== Keras ResNet-50 + PyTorch ResNet-50 $(date +%T)"
  timeout 60 python3 bench/torch_models.py --models resnet50 --modes f32 --layouts channels_last --steps 30 --warmup 5 --feed pageable --json $OUT/torch-r50.json 2>&1 | grep -E "train" | head -2
  bash bench/gpu_host.sh run "timeout 100 python3 bench/keras_models.py --models resnet50 --resnet50-steps 10 --resnet50-warmup 3 --json \$OUT/keras-r50.json 2>&1 | grep batch"
fi
echo "== done $(date +%T) ($(( $(date +%s) - T0 )) s)"; ls $OUT
# The device returns at most 8 files: everything in one archive.
tar -C $OUT -czf /tmp/l27-json.tar.gz . && rm -rf $OUT/* && mv /tmp/l27-json.tar.gz $OUT/
