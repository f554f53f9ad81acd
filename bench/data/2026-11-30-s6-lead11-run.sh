#!/usr/bin/env bash
# Lead, session 6, call 3 (x2 host): host-sync latency with spinning (TFWGPU_SPIN_US), the
# upload staging pool (TFWGPU_UPLOAD_POOL), and their effect on the replayed two-GPU CNN step
# and the ResNet-50 step.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune.json
mkdir -p /tmp/tr
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/tr/m.trace
zcat bench/traces/resnet50.trace.gz > /tmp/tr/r50.trace
for sp in 0 30 100 300; do
  echo "== latency TFWGPU_SPIN_US=$sp"; TFWGPU_SPIN_US=$sp timeout 30 $B transfer --mb 0.45 --reps 3 --latency 300 2>&1 | tail -1
done
for p in 1 0 1 0; do echo "== transfer TFWGPU_UPLOAD_POOL=$p"; TFWGPU_UPLOAD_POOL=$p timeout 30 $B transfer --mb 0.8,38.5 --reps 10 2>&1 | tail -2; done
run_m() { n=$1; shift; echo "== mirrored per-device $*"; env "$@" timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 4 --json $OUT/m-$n.json --timeline /tmp/tl-$n.jsonl 2>&1 | grep -E "steps \"[12]gpu|against"; python3 bench/replay_timeline.py /tmp/tl-$n.jsonl --label 2gpu | sed -n 2,7p; }
run_m base X=1
run_m spin100 TFWGPU_SPIN_US=100
run_m us100 TFWGPU_BATCH_US=100
run_m us100spin100 TFWGPU_BATCH_US=100 TFWGPU_SPIN_US=100
run_m idleus50spin100 TFWGPU_BATCH_IDLE_US=50 TFWGPU_SPIN_US=100
run_m us100spin300 TFWGPU_BATCH_US=100 TFWGPU_SPIN_US=300
run_r() { n=$1; shift; echo "== r50 $*"; env "$@" timeout 100 $B replay /tmp/tr/r50.trace --repeat 4 --json $OUT/r50-$n.json > /tmp/r50-$n.log 2>&1; grep -A 8 -E "steps \"train_step\"" /tmp/r50-$n.log | grep -v "train_step_end" | head -12; }
run_r pool X=1
run_r nopool TFWGPU_UPLOAD_POOL=0
run_r poolspin100 TFWGPU_SPIN_US=100
ls $OUT
