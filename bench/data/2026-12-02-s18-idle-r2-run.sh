#!/usr/bin/env bash
# Session 18, request 2 (issue 7): the idle rules A/B'd within one process. Request 1
# (s18-idle-r1, separate processes) could not decide: the processes' host speed differed up to
# 2.5x (the replayed CNN inference step's recording 0.035-0.094 ms), and the 50 us age rule
# cost a second, serialized submit only in the slow ones (flush 0.175-0.193 ms against
# 0.04-0.06). New: IdleRule::Quiet (TFWGPU_BATCH_IDLE_RULE=quiet: the idle age counts from the
# batch's latest command, so a burst being recorded is never split; the poller sends it once
# the host has been quiet for the age), and switches that change the rule between passes
# (`replay --idle-variants`) or between Keras blocks (bench/idle_ab.py, via the plugin's
# tfwgpu_set_batch_idle) of one process.
#
# Variants: age:50 (the default), quiet:50, off, age:150.
# Decision rule (written before the run): a candidate becomes the default if
#  (a) the replayed CNN infer_step median is lower than age:50's in >= 2 of 3 processes,
#  (b) the replayed CNN train_step median is not higher by > 3% in >= 2 of 3 processes,
#  (c) the replayed ResNet-50 train_step is within +2% in both processes,
#  (d) Keras (idle_ab, one GPU): train median not slower by > 2%, inference not by > 5%,
#  (e) the mirrored step on two logical devices of this GPU not slower by > 5%.
# Among candidates that pass, the lowest (a); within 3% of each other, quiet:50 first.
# Predictions: (a) age:50 0.17-0.35 ms by host speed, quiet:50 ~ off 0.19-0.23, age:150 the
# same unless recording passes 150 us; (b) quiet/off 5-10% lower; (c) +-1%; (d) train +-3%,
# inference 0 to -10% (one submit per call instead of two); (e) +-5%.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
export TFWGPU_TUNE_CACHE=/tmp/tune-s18.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu --format=csv -lms 250 > $L/smi.csv 2>&1 &
SMI=$!
gunzip -c bench/traces/cnn.trace.gz > /tmp/cnn-s18.trace
gunzip -c bench/traces/resnet50.trace.gz > /tmp/r50-s18.trace
B=./.hostrun/tfwgpu-bench
V=age:50,quiet:50,off,age:150
echo "== torch $(date +%T)"
timeout 40 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 3 --variants pageable+sync,infer --json $L/torch-kl.json > $L/torch-kl.txt 2>&1; grep -E "ms/" $L/torch-kl.txt
timeout 40 python3 bench/torch_infer_chain.py --json $L/torch-chain.json > $L/torch-chain.txt 2>&1; tail -1 $L/torch-chain.txt
for p in 1 2 3; do
  echo "-- replay cnn process $p $(date +%T)"
  timeout 60 $B replay /tmp/cnn-s18.trace --repeat 41 --idle-variants $V --json $L/replay-$p.json > $L/replay-$p.txt 2>&1
  grep -E "^  idle " $L/replay-$p.txt | sed -E 's/; warmup_infer.*//'
done
for p in 1 2; do
  left 200 || break
  echo "-- replay resnet50 process $p $(date +%T)"
  timeout 90 $B replay /tmp/r50-s18.trace --repeat 9 --idle-variants $V --json $L/r50-$p.json > $L/r50-$p.txt 2>&1
  grep -E "^  idle " $L/r50-$p.txt | sed -E 's/; warmup_infer.*//'
done
echo "-- keras, one GPU $(date +%T)"
bash bench/gpu_host.sh run "timeout 120 python3 bench/idle_ab.py --variants $V --rounds 6 --mirrored 0 --json $L/ab1.json 2>&1 | grep -E 'round|medians'"
left 420 && { echo "-- keras, two logical devices $(date +%T)"
bash bench/gpu_host.sh run "TFWGPU_VISIBLE_DEVICES=0,0 timeout 150 python3 bench/idle_ab.py --variants $V --rounds 5 --mirrored 40 --json $L/ab2.json 2>&1 | grep -E 'medians'"; }
kill $SMI 2>/dev/null
echo "== done $(date +%T) ($(( $(date +%s) - T0 )) s)"
tar czf $OUT/s18-idle-r2-logs.tgz -C $OUT logs && rm -rf $L
