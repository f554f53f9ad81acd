#!/usr/bin/env bash
# GPU host with two GPUs (`nvidia-h200-x2`): run two queues of requests at once, one per GPU,
# to spend half the device time on one-GPU measurements (kernel benches, Keras steps).
#   bash bench/gpu_par.sh LIMIT_S "name ..." "name ..."     (from the checkout root, after
#   `source .gl/activate.sh`, carrying .gl and the request folder .h200req/ with <name>.tar.xz)
# Each request is a tar.xz of a folder holding run.sh (run there with OUT=$OUT/<name>, under
# `timeout LIMIT_S`); its output comes back as $OUT/<name>.tgz. The first queue runs on Vulkan
# adapter 1 (TFWGPU_VISIBLE_DEVICES=1), the second on adapter 0. PyTorch in a request must use
# the same physical GPU: the CUDA index of Vulkan adapter 1 is found by load (a float32 conv
# bench on adapter 1 while nvidia-smi samples); where the probe sees no load, the script says so
# and assumes the same order. Used in session 11 (the probe found Vulkan 1 = CUDA 1).
set -u
ROOT=$(pwd); LIMIT=$1; Q1=$2; Q0=$3
one() { # name env...
  local n=$1; shift; local d=/tmp/req/$n; rm -rf $d; mkdir -p $d $OUT/$n
  tar -xJf .h200req/$n.tar.xz -C $d; ln -sfn $ROOT/.gl $d/.gl
  echo "== $n start $(date +%T) ($*)"
  ( cd $d && env "$@" OUT=$OUT/$n timeout $LIMIT bash run.sh > $OUT/$n/console.log 2>&1
    echo "rc=$?" >> $OUT/$n/console.log )
  echo "== $n end $(date +%T)"; tail -3 $OUT/$n/console.log
  echo "(env: $*)" >> $OUT/$n/console.log
  tar -C $OUT/$n -czf $OUT/$n.tgz . && rm -rf $OUT/$n
}
P=/tmp/gpu_par_probe; rm -rf $P; mkdir -p $P
B=$(ls -d /tmp/req/*/.hostrun/tfwgpu-bench 2>/dev/null | head -1)
[ -z "$B" ] && for n in $Q1 $Q0; do
  tar -xJf .h200req/$n.tar.xz -C $P ./.hostrun/tfwgpu-bench 2>/dev/null && B=$P/.hostrun/tfwgpu-bench && break
done
BUSY=""
if [ -n "$B" ]; then
  TFWGPU_VISIBLE_DEVICES=1 timeout 15 $B conv --dtype f32 --cases wide --ops fwd --reps 400 \
    --sample-ms 50 > $P/probe.txt 2>&1 &
  sleep 4
  nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 200 > $P/util.csv &
  S=$!; sleep 5; kill $S; wait
  BUSY=$(awk -F', *' '{u[$1]+=$2} END {b=""; m=0; for (i in u) if (u[i]>m) {m=u[i]; b=i}; print b}' $P/util.csv)
fi
if [ -z "$BUSY" ]; then
  echo "probe: no load seen on either GPU; assuming Vulkan 1 = CUDA 1"; BUSY=1
else
  echo "probe: Vulkan adapter 1 loads CUDA GPU $BUSY"
fi
OTHER=$(( 1 - BUSY ))
( for n in $Q1; do one $n TFWGPU_VISIBLE_DEVICES=1 CUDA_VISIBLE_DEVICES=$BUSY; done ) > $OUT/q1.log 2>&1 &
( for n in $Q0; do one $n TFWGPU_VISIBLE_DEVICES=0 CUDA_VISIBLE_DEVICES=$OTHER; done ) > $OUT/q0.log 2>&1 &
wait; cat $OUT/q1.log $OUT/q0.log; echo "== all done $(date +%T)"
