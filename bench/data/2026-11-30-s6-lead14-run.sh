#!/usr/bin/env bash
# Lead, session 6, final call (x2 host, merged tree: mm32, mofuse, coop4, the lead's runtime
# changes): MatMul f32/f16 at 4096 with PyTorch, host syncs and transfers, the ResNet-50 replay
# (multi-output fusion trace), the two-GPU replay per device.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-final.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
mkdir -p /tmp/tr
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/tr/m.trace
zcat bench/traces/resnet50-b2to64-multi.trace.gz > /tmp/tr/r50m.trace
echo "== matmul 4096 f32 (spin 50 / 0 alternating), f16 4096+8192, torch"
nvidia-smi --query-gpu=index,timestamp,clocks.sm,power.draw --format=csv,noheader -i 0 -lms 500 > /tmp/smi.txt 2>&1 &
SMI=$!
for sp in 50 0 50 0; do echo "-- f32 TFWGPU_SPIN_US=$sp"; TFWGPU_SPIN_US=$sp timeout 40 $B matmul --sizes 4096 --reps 5 --json $OUT/mm-f32-spin$sp.json 2>&1 | tail -1; done
for sp in 50 0; do echo "-- f16 TFWGPU_SPIN_US=$sp"; TFWGPU_SPIN_US=$sp timeout 40 $B matmul --dtype f16 --sizes 4096,8192 --reps 5 --json $OUT/mm-f16-spin$sp.json 2>&1 | tail -2; done
kill $SMI
awk -F, '{print $3}' /tmp/smi.txt | sort | uniq -c | sort -rn | head -4
timeout 60 python3 bench/torch_ref.py --sizes 4096 --reps 5 --json $OUT/torch-mm.json 2>&1 | grep -i "4096" | head -4
echo "== transfer + host-sync latency"
timeout 40 $B transfer --mb 0.8,38.5 --reps 8 --latency 300 --json $OUT/transfer.json 2>&1 | tail -3
echo "-- one copy thread"; TFWGPU_UPLOAD_THREADS=1 timeout 40 $B transfer --mb 38.5 --reps 8 2>&1 | tail -1
echo "== r50 replay (multi-output fusion trace, batch 64)"
timeout 120 $B replay /tmp/tr/r50m.trace --repeat 4 --json $OUT/r50-multi.json > /tmp/r50m.log 2>&1; echo "rc=$?"
grep -E "^replay x|dispatches by kernels|steps \"train_step\"|idle \(medians\)" /tmp/r50m.log | grep -v train_step_end | head -8
echo "== two GPUs per device"
timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 5 --json $OUT/mirrored.json --timeline /tmp/tl.jsonl 2>&1 | grep -E "steps \"[12]gpu|against"
python3 bench/replay_timeline.py /tmp/tl.jsonl --label 2gpu | sed -n 1,7p
ls $OUT
