#!/usr/bin/env bash
# host12 request 3 (issue 7): request 2 again with PyTorch in the same call (request 2's
# torch_keraslike.py lacked torch_models.py), without sk_if2, and host logs of base and snap.
# One release build of branch host12 (the same binaries as request 2). Variants:
#   base   = TFWGPU_MATMUL_SPLITK=0 (main's behaviour);
#   splitk = the default of this branch (split-K MatMul for few outputs over a long K);
#   snap   = splitk + TFWGPU_READ_SNAPSHOT_BYTES=16 (small kernel outputs copied back behind
#            their kernel: Keras's loss read waits for the loss's batch only).
# Request folder: .hostrun/{libtfwgpu_plugin.so,tfwgpu-bench}, bench/{keras_models,keras_floor,
# hostlog,hostlog_path,torch_keraslike,torch_models}.py, bench/gpu_host.sh,
# python/tensorflow_wgpu, traces/cnn.trace.gz.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host12.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
gunzip -c traces/cnn.trace.gz > /tmp/cnn-h12.trace
TK="timeout 30 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants device,pageable+sync,infer"
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
V_base="TFWGPU_MATMUL_SPLITK=0"
V_splitk="TFWGPU_MATMUL_SPLITK=1"
V_snap="TFWGPU_READ_SNAPSHOT_BYTES=16"
replay() {
  eval "e=\$V_$1"
  echo "== replay cnn ($1) $(date +%T)"
  env $e timeout 40 ./.hostrun/tfwgpu-bench replay /tmp/cnn-h12.trace --repeat 5 --top 12 --json $L/replay-$1.json > $L/replay-$1.txt 2>&1
  grep -E "steps \"(train|infer)_step\"" $L/replay-$1.txt
}
echo "== torch $(date +%T)"
$TK --json $L/torch-0.json > $L/torch-0.txt 2>&1; grep -E "ms/step" $L/torch-0.txt || tail -3 $L/torch-0.txt
replay splitk
replay base
echo "== keras floor (default build): Dense(1) fit, GPU then CPU $(date +%T)"
bash bench/gpu_host.sh run "timeout 30 python3 bench/keras_floor.py --devices /GPU:0,/CPU:0 --steps 300 --json $L/floor.json 2>&1 | grep -E 'fit Dense'"
for r in 1 2 3; do
  left 160 || { echo "(time: skipped round $r)"; break; }
  echo "-- round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in base splitk snap; do
    eval "e=\$V_$v"
    bash bench/gpu_host.sh run "echo -n '$v r$r: '; env $e $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
for v in base snap; do
  left 212 || { echo "(time: skipped host log $v)"; break; }
  eval "e=\$V_$v"
  echo "== host log: $v $(date +%T)"
  bash bench/gpu_host.sh run "env $e TFWGPU_HOST_LOG=/tmp/hl-$v.json timeout 25 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1 --json $L/budget-$v.json > $L/budget-$v.txt 2>&1; grep -E 'ms/step|ms/call' $L/budget-$v.txt | head -2"
  python3 bench/hostlog.py /tmp/hl-$v.json --json $L/hostlog-$v.json > $L/hostlog-$v.txt 2>&1
  python3 bench/hostlog_path.py /tmp/hl-$v.json --json $L/path-$v.json > $L/path-$v.txt 2>&1
  gzip -c /tmp/hl-$v.json > $L/hl-$v.json.gz; rm -f /tmp/hl-$v.json
  grep -E "loss_read|ops |step " $L/path-$v.txt
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-*.txt 2>/dev/null
