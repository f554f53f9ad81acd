#!/usr/bin/env bash
# host9 request 2 (issue 7): the Keras CNN step (batch 64, SGD momentum), branch host9 vs main.
#   new  = branch host9 (release): request 1's fusions (dropout, loss scalars, label casts on
#          the host) + a Conv2D/MatMul and its BiasAdd as one kernel call: 51 -> 41 kernel
#          calls per training step, 9 -> 7 per inference call (lavapipe counts);
#   main = main's release plugin (session 8), same python package.
# Host budget with TFWGPU_HOST_TIMERS=1 (the compute callback's CPU per call), alternated new,
# main, new, main; then plain timing of new with TFWGPU_SUBMIT_THREAD=1 / 0 (request 1's
# pairs: 3.37/3.80, 3.32/3.49 ms). PyTorch like for like first (same call).
# NEEDS TensorFlow 2.21 + Keras staged in /tmp/site. Self-contained (own site dirs under
# /tmp/host9). ~100 s; steps skipped past 108 s. Output: console.log; $OUT/host9-r2.tar.gz.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt 108 ]; }
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz libtfwgpu_plugin_main.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/host9-json; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 10 ./tfwgpu-bench devices 2>&1 | head -3
echo "== torch like for like: train (pageable+loss.item) and infer (200 calls, one read) $(date +%T)"
timeout 20 python3 torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer --json $J/torch-keraslike.json 2>&1 | tail -2
if [ ! -d /tmp/site/tensorflow ]; then echo "NO TENSORFLOW in /tmp/site: Keras parts skipped"; else
rm -rf /tmp/host9; mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
for v in new main; do
  sp=/tmp/host9/$v/site-packages; mkdir -p $sp/tensorflow-plugins
  if [ $v = new ]; then cp libtfwgpu_plugin.so $sp/tensorflow-plugins/; else cp libtfwgpu_plugin_main.so $sp/tensorflow-plugins/libtfwgpu_plugin.so; fi
  cp -r tensorflow_wgpu $sp/
  echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
  echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
done
export TF_CPP_MIN_LOG_LEVEL=2
K="python3 keras_models.py --models cnn"
pp() { echo "/tmp/host9/$1/site-packages:/tmp/tf/site-packages"; }
echo "== keras cnn batch 64: host budget with host timers (train 200 steps; inference 200 calls) $(date +%T)"
n=0
for v in new main new main; do
  left || { echo "(time: skipped the rest)"; break; }
  n=$((n+1)); echo "-- $v $(date +%T)"
  TFWGPU_HOST_TIMERS=1 PYTHONPATH=$(pp $v) timeout 20 $K --steps 200 --warmup 10 --host-budget 1 --json $J/budget-$v-$n.json 2>&1 | grep -v -i warn | tail -7
done
echo "== keras cnn timing: new with TFWGPU_SUBMIT_THREAD=1 / 0 $(date +%T)"
for st in 1 0; do
  left || { echo "(time: skipped)"; break; }
  n=$((n+1)); echo "-- new TFWGPU_SUBMIT_THREAD=$st"
  TFWGPU_SUBMIT_THREAD=$st PYTHONPATH=$(pp new) timeout 16 $K --steps 300 --warmup 10 --json $J/keras-st$st-$n.json 2>&1 | grep batch
done
fi
tar -czf $OUT/host9-r2.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T) ($(( $(date +%s) - T0 )) s)"
