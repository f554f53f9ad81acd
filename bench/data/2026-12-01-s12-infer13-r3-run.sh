#!/usr/bin/env bash
# infer13 request 3 (issue 7; prepared in session 12, NOT run): whether one submit per
# synchronized step can be the default. Session 12 (bench/RESULTS.md, infer13): with the 1 ms
# spin (the branch's default), TFWGPU_BATCH_IDLE_US=0 made the replayed CNN inference step
# 0.203-0.226 ms (main 0.275-0.331) and the replayed training step 0.82-0.88 ms (main
# 0.93-1.06), 3 of 3 rounds; the idle-age rule exists for slow recorders (Keras's ~0.8 ms of
# callbacks per training step) and for MirroredStrategy's two-GPU step (session 6), neither
# measured without it. Decision rule: default TFWGPU_BATCH_IDLE_US=0 if the Keras CNN step
# (train and infer) is not slower in at least 2 of 3 pairs and, on the two-GPU host, the
# mirrored step (bench/mirrored.py --only all) is not slower in both pairs.
# Needs the request folder of bench/data/2026-12-01-s12-infer13-r2-run.sh plus bench/mirrored.py
# and python/tensorflow_wgpu (demo); run on the two-GPU host for part 3. Its logic was not tried
# locally (it needs TensorFlow through bench/gpu_host.sh and two GPUs).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-infer13.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
gunzip -c traces/cnn.trace.gz > /tmp/cnn-i13.trace
B=./.hostrun/tfwgpu-bench
V_new="TFWGPU_LOG=warn"
V_ia0="TFWGPU_BATCH_IDLE_US=0"
echo "== torch $(date +%T)"
timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer --json $L/torch-kl.json > $L/torch-kl.txt 2>&1; grep -E "ms/step" $L/torch-kl.txt
for r in 1 2 3; do
  echo "-- round $r $(date +%T)"
  vs="new ia0"; [ $r = 2 ] && vs="ia0 new"
  for v in $vs; do
    eval "e=\$V_$v"
    env $e timeout 30 $B replay /tmp/cnn-i13.trace --repeat 15 --json $L/replay-$v-$r.json > $L/replay-$v-$r.txt 2>&1
    echo "$v r$r replay: $(grep -E '^  steps "(infer|train)_step":' $L/replay-$v-$r.txt | tr -s ' ' | tr '\n' ' ')"
    bash bench/gpu_host.sh run "echo -n '$v r$r keras: '; env $e timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10 --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  for r in 1 2; do
    left 150 || break
    vs="new ia0"; [ $r = 2 ] && vs="ia0 new"
    for v in $vs; do
      eval "e=\$V_$v"
      bash bench/gpu_host.sh run "echo -n '$v r$r mirrored: '; env $e TFWGPU_VISIBLE_DEVICES=0,1 timeout 40 python3 bench/mirrored.py --only all --steps 100 --json $L/mirrored-$v-$r.json > $L/mirrored-$v-$r.txt 2>&1; python3 -c \"import json; r=json.load(open('$L/mirrored-$v-$r.json'))['all']; print(round(r['images_per_s']), 'images/s')\""
    done
  done
fi
echo "== done $(date +%T) ($(( $(date +%s) - T0 )) s)"
