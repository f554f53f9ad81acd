#!/usr/bin/env bash
# host9 request 1 (issue 7): the Keras CNN step (batch 64, SGD momentum) with fewer kernel calls:
#   new  = branch host9 (release): the dropout's GreaterEqual/Mul/SelectV2 and its gradient's
#          SelectV2/Mul fused (comparison kept in the program), the loss/metric scalars'
#          DivNoNan/AddV2/Mul in one kernel, the labels' two Casts on the host: 51 -> 43 kernel
#          calls per step (lavapipe count);
#   main = main's release plugin (95c96cc/29b88a4, session 8), same python package.
# Alternated in separate processes: host budget new, main, new, main; then plain timing with
# TFWGPU_SUBMIT_THREAD=1 vs default (new), alternated. PyTorch like for like (training with the
# pageable batch + loss.item(), and inference timed as keras_models.py times it) first.
# NEEDS TensorFlow 2.21 + Keras staged in /tmp/site. Self-contained: its own site dirs under
# /tmp/host9 (does not touch /tmp/w). ~130 s; steps skipped past 138 s.
# Output: console.log; $OUT/host9-r1.tar.gz (JSON).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt 138 ]; }
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz libtfwgpu_plugin_main.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/host9-json; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 15 ./tfwgpu-bench devices 2>&1 | head -3
echo "== torch like for like: train (device / pageable+loss.item) and infer (200 calls, one read) $(date +%T)"
timeout 30 python3 torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 2 --variants device,pageable+sync,infer --json $J/torch-keraslike.json 2>&1 | tail -3
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
echo "== keras cnn batch 64: host budget (train 200 steps; inference 200 calls; call overhead) $(date +%T)"
n=0
for v in new main new main; do
  left || { echo "(time: skipped the rest)"; break; }
  n=$((n+1)); echo "-- $v $(date +%T)"
  PYTHONPATH=$(pp $v) timeout 22 $K --steps 200 --warmup 10 --host-budget 1 --json $J/budget-$v-$n.json 2>&1 | grep -v -i warn | tail -7
done
echo "== keras cnn timing (fit train step / infer step): new with TFWGPU_SUBMIT_THREAD=1 / default, alternated $(date +%T)"
for st in 1 0 1 0; do
  left || { echo "(time: skipped)"; break; }
  n=$((n+1)); echo "-- new TFWGPU_SUBMIT_THREAD=$st"
  TFWGPU_SUBMIT_THREAD=$st PYTHONPATH=$(pp new) timeout 20 $K --steps 300 --warmup 10 --json $J/keras-st$st-$n.json 2>&1 | grep batch
done
fi
tar -czf $OUT/host9-r1.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T) ($(( $(date +%s) - T0 )) s)"
