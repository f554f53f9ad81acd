#!/usr/bin/env bash
# Lead, session 6: the two-GPU per-device replay, default settings against the same settings
# given explicitly, alternating (the final call's 0.84x against call 4's 1.46-1.49x), with
# both GPUs' SM clocks sampled.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-final.json
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/m.trace
nvidia-smi --query-gpu=index,clocks.sm --format=csv,noheader -lms 200 > /tmp/smi.txt 2>&1 &
SMI=$!
for e in X=1 TFWGPU_BATCH_IDLE_US=50 X=1 TFWGPU_BATCH_IDLE_US=50 X=1; do
  echo "-- $e"; env $e timeout 40 $B replay /tmp/m.trace --per-device --repeat 4 2>&1 | grep -E "steps \"[12]gpu|against"
done
kill $SMI
sort /tmp/smi.txt | uniq -c | sort -rn | head -8
