#!/usr/bin/env bash
# Issue 8, for the two-GPU host (`nvidia-h200-x2`), ~10 s, no TensorFlow: whether the H200
# driver lets a timeline semaphore exported by one GPU as an OPAQUE_FD order the other GPU's
# queue (the spec promises it only between devices with equal UUIDs), and whether the two GPUs
# form a device group (`tfwgpu-bench vkprobe`, raw Vulkan). If the cross-device semaphore works,
# the GPU-to-GPU exchange at the tag dual11-peer (host memory imported into both devices) can be
# ordered by it instead of by the host; see bench/RESULTS.md, session 11, dual11.
set -u
source .gl/activate.sh 2>/dev/null || true
B=.hostrun/tfwgpu-bench
nvidia-smi -L
for p in 0,1 1,0 0,0; do
  echo "== vkprobe --pair $p"
  timeout 60 $B vkprobe --pair $p --rounds 50 2>&1
  echo "rc=$?"
done
