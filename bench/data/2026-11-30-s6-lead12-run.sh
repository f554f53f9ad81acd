#!/usr/bin/env bash
# Lead, session 6, call 4 (x2 host): the new defaults (spin 50 us on GPUs, upload pool) against
# the old ones, and an idle age of 50 us, on the ResNet-50 replay and the two-GPU CNN replay,
# alternating; the two-GPU step's events for the best setting.
set -u
cd ../..
B=.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune.json
mkdir -p /tmp/tr
zcat bench/traces/mirrored-cnn-2dev.trace.gz > /tmp/tr/m.trace
zcat bench/traces/resnet50.trace.gz > /tmp/tr/r50.trace
OLD="TFWGPU_SPIN_US=0 TFWGPU_UPLOAD_POOL=0"
run_r() { n=$1; shift; echo "== r50 $n: $*"; env "$@" timeout 100 $B replay /tmp/tr/r50.trace --repeat 5 --json $OUT/r50-$n.json > /tmp/r50-$n.log 2>&1; grep -E "steps \"train_step\"|idle \(medians\)" /tmp/r50-$n.log | grep -v "train_step_end" | head -3; grep -A 4 "longest idle stretches between batches in its last step" /tmp/r50-$n.log | sed -n 7,12p; }
run_m() { n=$1; shift; echo "== mirrored $n: $*"; env "$@" timeout 60 $B replay /tmp/tr/m.trace --per-device --repeat 5 --json $OUT/m-$n.json --timeline /tmp/tl-$n.jsonl 2>&1 | grep -E "steps \"[12]gpu|against"; python3 bench/replay_timeline.py /tmp/tl-$n.jsonl --label 2gpu | sed -n 2,7p; }
run_r old1 $OLD
run_r new1 X=1
run_r newidle1 TFWGPU_BATCH_IDLE_US=50
run_r old2 $OLD
run_r new2 X=1
run_r newidle2 TFWGPU_BATCH_IDLE_US=50
run_m old1 $OLD TFWGPU_BATCH_IDLE_US=50
run_m new1 TFWGPU_BATCH_IDLE_US=50
run_m newus100 TFWGPU_BATCH_US=100
run_m old2 $OLD TFWGPU_BATCH_IDLE_US=50
run_m new2 TFWGPU_BATCH_IDLE_US=50
python3 bench/replay_timeline.py /tmp/tl-new2.jsonl --label 2gpu > $OUT/timeline-new2.txt
gzip -c /tmp/tl-new2.jsonl > $OUT/timeline-new2.jsonl.gz
for sp in 0 50; do echo "== latency TFWGPU_SPIN_US=$sp"; TFWGPU_SPIN_US=$sp timeout 30 $B transfer --mb 0.8,38.5 --reps 10 --latency 300 2>&1 | tail -3; done
ls $OUT
