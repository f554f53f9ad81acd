#!/usr/bin/env bash
# Session 18, request 5 (issue 7): TensorFlow's threading for the Keras CNN inference call on
# tfwgpu, against PyTorch's call interleaved in the same process (bench/infer_interleaved.py:
# the keras/torch ratio per round normalizes the host's speed, which differs between processes).
# Variants (TensorFlow's own environment switches, read when it starts): default (the
# PluggableDevice's kernels run on TensorFlow's shared inter-op pool), TF_GPU_THREAD_MODE=
# gpu_private (two threads of the device's own), TF_NUM_INTEROP_THREADS=1.
# Perf on lavapipe (NOTES-infer.md, session 18) put much of the inter-op threads' time in the
# Eigen pool's stealing and spinning. PREDICTION: default 1.6-2.0x (request 3: 1.67, 1.96);
# gpu_private and interop1 within +-10% of it. Decision: a variant lower than default in both of
# its processes by > 5% (per-process ratio medians) is worth making tensorflow_wgpu's default
# (set before TensorFlow starts its devices, unless the user set it).
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
export TFWGPU_TUNE_CACHE=/tmp/tune-s18.json
for k in 1 2; do
  for v in default gpu_private interop1; do
    case $v in default) e="X=1";; gpu_private) e="TF_GPU_THREAD_MODE=gpu_private";; interop1) e="TF_NUM_INTEROP_THREADS=1";; esac
    bash bench/gpu_host.sh run "echo -n '$v $k: '; env $e timeout 90 python3 bench/infer_interleaved.py --calls 300 --rounds 10 --json $L/ii-$v-$k.json 2>&1 | grep -E '^medians'"
  done
done
tar czf $OUT/s18-infer-r5-logs.tgz -C $OUT logs && rm -rf $L
# Follow-up run in the same warm machine (the command line as sent, after the script):
#   for k in 1 2; do for e in X=1 TF_GPU_THREAD_MODE=gpu_private; do bash bench/gpu_host.sh run \
#     "echo -n '$e $k: '; env $e timeout 40 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10 2>&1 | grep batch"; done; done
# Its console (nothing else came back):
#   X=1 1: cnn batch 64: train 2.847 ms/step infer 0.469 ms/step loss 0.0397
#   TF_GPU_THREAD_MODE=gpu_private 1: cnn batch 64: train 2.985 ms/step infer 0.449 ms/step loss 0.0397
#   X=1 2: cnn batch 64: train 3.035 ms/step infer 0.608 ms/step loss 0.0397
#   TF_GPU_THREAD_MODE=gpu_private 2: cnn batch 64: train 3.221 ms/step infer 0.592 ms/step loss 0.0397
