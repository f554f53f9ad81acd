#!/usr/bin/env bash
# host8 request 2 (issue 7): the Keras CNN step (batch 64), this branch's defaults against
# main's behaviour, alternated, one process each, and two of the branch's changes singly:
#   new  = defaults: TFWGPU_SYNC=ordered (Device::Sync submits, waits only for the work of the
#          sync 2 back: TFWGPU_SYNC_DEPTH=2), TFWGPU_PIN_SEEDS=1 (dropout seed on the host),
#          TFWGPU_ARENA_UPLOAD_BYTES=16384 (small uploads through the batch's uniform arena)
#   old  = main: TFWGPU_SYNC=completed TFWGPU_PIN_SEEDS=0 TFWGPU_ARENA_UPLOAD_BYTES=0
#   d1   = new with TFWGPU_SYNC_DEPTH=1 (request 1's bound)
#   noar = new with TFWGPU_ARENA_UPLOAD_BYTES=0
# Host budget per step (train; inference; TF's tf.function call overhead), then plain
# keras_models timing new/old alternated.
# NEEDS TensorFlow 2.21 + Keras staged in /tmp/site (as for request 1). Own plugin in
# /tmp/host8/site-packages (does not touch /tmp/w). At most 120 s (lead's limit): each run
# under `timeout 20`, nothing new starts past 95 s. (PyTorch: not run, request 1 has it.)
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt 95 ]; }
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/host8-json2; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 20 ./tfwgpu-bench devices 2>&1 | head -3
if [ ! -d /tmp/site/tensorflow ]; then echo "NO TENSORFLOW in /tmp/site: Keras parts skipped"; else
sp=/tmp/host8/site-packages
rm -rf /tmp/host8; mkdir -p $sp/tensorflow-plugins
cp libtfwgpu_plugin.so $sp/tensorflow-plugins/
cp -r tensorflow_wgpu $sp/
echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
export PYTHONPATH=$sp:/tmp/tf/site-packages
export TF_CPP_MIN_LOG_LEVEL=2
K="python3 keras_models.py --models cnn"
env_of() { case $1 in
  new) echo "TFWGPU_SYNC=ordered";;
  old) echo "TFWGPU_SYNC=completed TFWGPU_PIN_SEEDS=0 TFWGPU_ARENA_UPLOAD_BYTES=0";;
  d1) echo "TFWGPU_SYNC_DEPTH=1";;
  noar) echo "TFWGPU_ARENA_UPLOAD_BYTES=0";; esac; }
echo "== keras cnn batch 64: host budget (train 200 steps; inference 200 calls; call overhead) $(date +%T)"
n=0
for c in new old noar d1; do
  left || { echo "(time: skipped the rest)"; break; }
  n=$((n+1)); E=$(env_of $c); echo "-- $c: $E $(date +%T)"
  env $E timeout 20 $K --steps 200 --warmup 10 --host-budget 1 --json $J/budget-$c-$n.json 2>&1 | grep -v -i warn | tail -7
done
echo "== keras cnn timing (fit train step / infer step), alternated $(date +%T)"
for c in new old new; do
  left || { echo "(time: skipped)"; break; }
  n=$((n+1)); E=$(env_of $c); echo "-- $c: $E"
  env $E timeout 20 $K --steps 300 --warmup 10 --json $J/keras-$c-$n.json 2>&1 | grep batch
done
fi
tar -czf $OUT/host8-r2.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T) ($(( $(date +%s) - T0 )) s)"
