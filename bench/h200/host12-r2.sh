#!/usr/bin/env bash
# host12 request 2 (issue 7; replaces request 1 if that has not run): the Keras CNN step (batch 64) with the split-K MatMul kernel for
# few outputs over a long K (the Dense layer, 64 x 10 over K = 1152), against main's kernel
# (TFWGPU_MATMUL_SPLITK=0) and PyTorch, interleaved in three rounds (separate processes), plus
# the replayed step of a fresh CNN trace. One release build of branch host12. Variants:
#   base   = TFWGPU_MATMUL_SPLITK=0 (main's behaviour);
#   splitk = the default of this branch;
#   snap   = splitk + TFWGPU_READ_SNAPSHOT_BYTES=16 (small kernel outputs copied back behind
#            their kernel: Keras's loss read waits for the loss's batch only, no submit of its own);
#   sk_if2 = splitk + TFWGPU_BATCH_IDLE_INFLIGHT=2 (a batch is submitted when fewer than two are
#            in flight: the step's tail batch goes to the GPU while the one before it runs).
# Request folder: .hostrun/{libtfwgpu_plugin.so,tfwgpu-bench}, bench/{keras_models,keras_floor,
# hostlog,torch_keraslike}.py, bench/gpu_host.sh, python/tensorflow_wgpu, traces/cnn.trace.gz.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host12.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
gunzip -c traces/cnn.trace.gz > /tmp/cnn-h12.trace
replay() {
  e=""; [ $1 = base ] && e="TFWGPU_MATMUL_SPLITK=0"
  echo "== replay cnn ($1) $(date +%T)"
  env $e timeout 40 ./.hostrun/tfwgpu-bench replay /tmp/cnn-h12.trace --repeat 5 --top 12 --json $L/replay-$1.json > $L/replay-$1.txt 2>&1
  grep -E "steps \"(train|infer)_step\"" $L/replay-$1.txt
  sed -n '/op (GPU time/,/wrote/p' $L/replay-$1.txt | head -14
}
replay splitk
echo "== keras floor (default build): Dense(1) fit, GPU then CPU $(date +%T)"
bash bench/gpu_host.sh run "timeout 30 python3 bench/keras_floor.py --devices /GPU:0,/CPU:0 --steps 300 --json $L/floor.json 2>&1 | grep -E 'fit Dense'"
replay base
TK="timeout 30 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants device,pageable+sync,infer"
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
V_base="TFWGPU_MATMUL_SPLITK=0"
V_splitk="TFWGPU_MATMUL_SPLITK=1"
V_snap="TFWGPU_READ_SNAPSHOT_BYTES=16"
V_sk_if2="TFWGPU_BATCH_IDLE_INFLIGHT=2"
for r in 1 2 3; do
  left 168 || { echo "(time: skipped round $r)"; break; }
  echo "-- round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in base splitk snap sk_if2; do
    eval "e=\$V_$v"
    bash bench/gpu_host.sh run "echo -n '$v r$r: '; env $e $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
if left 205; then
  echo "== host log: snap $(date +%T)"
  bash bench/gpu_host.sh run "$V_snap TFWGPU_HOST_LOG=/tmp/hl-snap.json timeout 25 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1 --json $L/budget-snap.json > $L/budget-snap.txt 2>&1; grep -E 'ms/step|ms/call' $L/budget-snap.txt"
  python3 bench/hostlog.py /tmp/hl-snap.json --json $L/hostlog-snap.json > $L/hostlog-snap.txt 2>&1
  python3 bench/hostlog_path.py /tmp/hl-snap.json --json $L/path-snap.json 2>&1 | head -16
  gzip -c /tmp/hl-snap.json > $L/hl-snap.json.gz; rm -f /tmp/hl-snap.json
  grep -E "^(submit |sync|dtoh|wait)" $L/hostlog-snap.txt | head -8
fi
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-*.txt 2>/dev/null
