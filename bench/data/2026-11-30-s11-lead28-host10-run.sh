#!/usr/bin/env bash
# host10 request 3 (issue 7; not run in session 10, ready for the lead): the Keras CNN step
# (batch 64) against PyTorch like for like, interleaved in three rounds (separate processes),
# after commit 14be0aa (with a submit thread, the input's upload hands its staged write to the
# submit thread and returns once staged). One release plugin of branch host10, variants:
#   base  = TFWGPU_DIRECT_UNLOCKED=0 TFWGPU_SUBMIT_THREAD=0 (main's behaviour);
#   fixst = TFWGPU_SUBMIT_THREAD=1 (large upload out of the lock, its write and the ordered
#           sync's batch on the submit thread);
#   fixst1m = fixst + TFWGPU_DIRECT_UPLOAD_BYTES=1048576 (the 200 KB input through a mapped
#           buffer of its own instead of the queue's staging).
# Then Keras's floor (fixst, base) and one host-logged budget run of fixst. Request folder as
# for requests 1-2 (.hostrun/libtfwgpu_plugin.so, bench/{keras_models,keras_floor,hostlog,
# torch_keraslike,torch_models,gpu_host}.py/sh, python/tensorflow_wgpu). ~215 s.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host10.json
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
TK="timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
V_base="TFWGPU_DIRECT_UNLOCKED=0 TFWGPU_SUBMIT_THREAD=0"
V_fixst="TFWGPU_SUBMIT_THREAD=1"
V_fixst1m="TFWGPU_SUBMIT_THREAD=1 TFWGPU_DIRECT_UPLOAD_BYTES=1048576"
for r in 1 2 3; do
  left 200 || { echo "(time: skipped round $r)"; break; }
  echo "-- round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in base fixst fixst1m; do
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
