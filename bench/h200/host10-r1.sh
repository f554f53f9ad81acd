#!/usr/bin/env bash
# host10 request 1 (issue 7): where the Keras CNN step's small host-to-device copies spend their
# 70-125 us each on the H200. Release plugin of branch host10 with the host log
# (TFWGPU_HOST_LOG: spans of memcpy_htod and of every lock wait, encoder creation, submit,
# dispatch, poll inside it; bench/hostlog.py summarises) in four variants, one process each:
#   default | TFWGPU_SUBMIT_THREAD=1 | TFWGPU_DIRECT_UPLOAD_BYTES=1048576 (the 200 KB input
#   through a buffer of its own, outside the batch lock) | TFWGPU_SPARE_ENCODER=1 (the poller
#   makes the next batch's command encoder in advance);
# then Keras's floor (keras_floor.py: Dense(1) fit, CPU then our GPU, the GPU's run logged);
# then timing without the log, variants alternated, as time allows. PyTorch like for like once.
# Runs from the request folder (.gl, .hostrun, bench/, python/). ~200 s; parts skipped past 215 s.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host10.json
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "== torch like for like $(date +%T)"
timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer 2>&1 | grep -E "ms/step"
KB="timeout 40 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1"
run_log() {  # name, env...
  local n=$1; shift
  echo "== host log: $n $(date +%T)"
  bash bench/gpu_host.sh run "env $* TFWGPU_HOST_LOG=/tmp/hl-$n.json $KB --json $L/budget-$n.json > $L/budget-$n.txt 2>&1; grep -E 'ms/step|h2d wall' $L/budget-$n.txt | grep -v infer"
  python3 bench/hostlog.py /tmp/hl-$n.json --timeline 100 --json $L/hostlog-$n.json > $L/hostlog-$n.txt 2>&1
  sed -n '1,40p' $L/hostlog-$n.txt | grep -E "host log|^(htod|submit|compute|dispatch|arena|encoder|direct|poll|sync|dtoh|wait|staged|bind)|   " | head -40
  gzip -c /tmp/hl-$n.json > $L/hl-$n.json.gz; rm -f /tmp/hl-$n.json
}
run_log default TFWGPU_X=0
left 215 && run_log submit_thread TFWGPU_SUBMIT_THREAD=1
left 215 && run_log direct1m TFWGPU_DIRECT_UPLOAD_BYTES=1048576
left 215 && run_log spare TFWGPU_SPARE_ENCODER=1
if left 190; then
  echo "== keras floor: Dense(1) fit, CPU then GPU (GPU logged) $(date +%T)"
  bash bench/gpu_host.sh run "TFWGPU_HOST_LOG=/tmp/hl-floor.json timeout 45 python3 bench/keras_floor.py --devices /CPU:0,/GPU:0 --steps 300 --json $L/floor.json 2>&1 | grep -E 'ms|GPU|CPU' | grep -v -i warn | tail -8"
  python3 bench/hostlog.py /tmp/hl-floor.json --timeline 100 --json $L/hostlog-floor.json > $L/hostlog-floor.txt 2>&1
  sed -n '1,30p' $L/hostlog-floor.txt
  gzip -c /tmp/hl-floor.json > $L/hl-floor.json.gz; rm -f /tmp/hl-floor.json
fi
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
echo "== timing without the log (train / infer ms) $(date +%T)"
for r in 1 2; do
  for v in "default TFWGPU_X=0" "submit_thread TFWGPU_SUBMIT_THREAD=1" "direct1m TFWGPU_DIRECT_UPLOAD_BYTES=1048576" "spare TFWGPU_SPARE_ENCODER=1"; do
    set -- $v
    left 222 || { echo "(time: skipped $1 round $r)"; continue; }
    bash bench/gpu_host.sh run "echo -n '$1 r$r: '; env $2 $KM --json $L/time-$1-$r.json 2>&1 | grep batch"
  done
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
for n in default submit_thread direct1m spare floor; do
  [ -f $L/hostlog-$n.txt ] && { echo "-- $n"; grep -E "^(htod|submit |arena|encoder|direct|sync|dtoh)" $L/hostlog-$n.txt | head -12; }
done
