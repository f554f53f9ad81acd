#!/usr/bin/env bash
# host10 request 2 (issue 7): the Keras CNN step (batch 64) with the large upload out of the
# batch lock, against PyTorch like for like, interleaved in three rounds (separate processes).
# One release plugin (branch host10), variants by environment:
#   base  = TFWGPU_DIRECT_UNLOCKED=0 TFWGPU_SUBMIT_THREAD=0: main's behaviour (the 200 KB input
#           stages, copies and submits twice under the batch lock; recording threads submit);
#   fix   = default: the large upload stages and copies outside the lock and submits in its own
#           place in the submit order (TFWGPU_DIRECT_UNLOCKED=1);
#   fixst = fix + TFWGPU_SUBMIT_THREAD=1 (due batches, the direct upload's open batch and the
#           ordered sync's flush go to the submit thread).
# Then Keras's floor (keras_floor.py, Dense(1) fit; CPU and our GPU, fixst and base), and one
# host-logged budget run of fixst. ~215 s; parts skipped past 220 s.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host10.json
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
TK="timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
V_base="TFWGPU_DIRECT_UNLOCKED=0 TFWGPU_SUBMIT_THREAD=0"
V_fix="TFWGPU_X=0"
V_fixst="TFWGPU_SUBMIT_THREAD=1"
for r in 1 2 3; do
  left 200 || { echo "(time: skipped round $r)"; break; }
  echo "-- round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in base fix fixst; do
    eval "e=\$V_$v"
    bash bench/gpu_host.sh run "echo -n '$v r$r: '; env $e $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
if left 190; then
  echo "== keras floor, fixst: Dense(1) fit, GPU then CPU $(date +%T)"
  bash bench/gpu_host.sh run "env $V_fixst timeout 40 python3 bench/keras_floor.py --devices /GPU:0,/CPU:0 --steps 300 --json $L/floor-fixst.json 2>&1 | grep -E 'fit Dense'"
fi
if left 205; then
  echo "== keras floor, base: GPU only $(date +%T)"
  bash bench/gpu_host.sh run "env $V_base timeout 30 python3 bench/keras_floor.py --devices /GPU:0 --steps 300 --json $L/floor-base.json 2>&1 | grep -E 'fit Dense'"
fi
if left 205; then
  echo "== host log: fixst $(date +%T)"
  bash bench/gpu_host.sh run "env $V_fixst TFWGPU_HOST_LOG=/tmp/hl-fixst.json timeout 30 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1 --json $L/budget-fixst.json > $L/budget-fixst.txt 2>&1; grep -E 'ms/step|h2d wall' $L/budget-fixst.txt | grep -v infer"
  python3 bench/hostlog.py /tmp/hl-fixst.json --timeline 100 --json $L/hostlog-fixst.json > $L/hostlog-fixst.txt 2>&1
  gzip -c /tmp/hl-fixst.json > $L/hl-fixst.json.gz; rm -f /tmp/hl-fixst.json
  grep -E "^(htod|submit |arena_lock|direct|sync|dtoh)|^   [a-z]" $L/hostlog-fixst.txt | head -24
fi
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-*.txt 2>/dev/null
