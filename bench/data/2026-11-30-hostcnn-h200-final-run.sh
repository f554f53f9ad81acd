#!/usr/bin/env bash
# hostcnn final request (issue 7): the Keras CNN training step's host time on the H200, this
# branch's changes against main's behaviour, alternated in one process start each.
# NEEDS TensorFlow 2.21 staged in /tmp/site (the lead's final call). Self-contained: own plugin
# (branch hostcnn, release, rebased on main 8c1aaf9) from its own site dir
# /tmp/hostcnn/site-packages (does not touch /tmp/w). ~2.5 min.
#   old = main's behaviour: TFWGPU_EVENTS=completed (events wait for the GPU) and
#         TFWGPU_DYNAMIC_STORAGE=0 (bind groups keyed by tensor offsets)
#   new = this branch's defaults (events complete once ordered; dynamic storage offsets)
# Output: console.log; $OUT/hostcnn-final.tar.gz (JSON).
set -u
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/hostcnn-json; rm -rf $J; mkdir -p $J
echo "== devices"; timeout 20 ./tfwgpu-bench devices 2>&1 | head -3
echo "== torch (like for like: batch on device / pageable copy / + loss.item() per step) $(date +%T)"
timeout 45 python3 torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 3 --json $J/torch-keraslike.json 2>&1 | tail -3
if [ ! -d /tmp/site/tensorflow ]; then echo "NO TENSORFLOW in /tmp/site: Keras parts skipped"; else
sp=/tmp/hostcnn/site-packages
rm -rf /tmp/hostcnn; mkdir -p $sp/tensorflow-plugins
cp libtfwgpu_plugin.so $sp/tensorflow-plugins/
cp -r tensorflow_wgpu $sp/
echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
export PYTHONPATH=$sp:/tmp/tf/site-packages
export TF_CPP_MIN_LOG_LEVEL=2
K="python3 keras_models.py --models cnn"
OLD="TFWGPU_EVENTS=completed TFWGPU_DYNAMIC_STORAGE=0"
echo "== keras cnn batch 64: host budget per step, old/new alternated $(date +%T)"
for c in old new old new; do
  if [ $c = old ]; then E=$OLD; else E=""; fi
  echo "-- $c: $E"
  env $E timeout 30 $K --steps 250 --warmup 10 --host-budget 2 --json $J/budget-$c-$RANDOM.json 2>&1 | grep -v -i warn | tail -6
done
echo "== keras cnn timing (fit train step / infer step), new, old $(date +%T)"
timeout 30 $K --steps 200 --warmup 10 --json $J/keras-new.json 2>&1 | grep batch
env $OLD timeout 30 $K --steps 200 --warmup 10 --json $J/keras-old.json 2>&1 | grep batch
echo "== keras cnn host budget, new, plugin callback phases (TFWGPU_HOST_TIMERS=1); /CPU:0 $(date +%T)"
TFWGPU_HOST_TIMERS=1 timeout 30 $K --steps 250 --warmup 10 --host-budget 1 --json $J/budget-timers.json 2>&1 | grep -v -i warn | tail -3
timeout 30 $K --device /CPU:0 --steps 250 --warmup 10 --host-budget 1 --json $J/budget-cpu.json 2>&1 | grep -v -i warn | tail -3
fi
tar -czf $OUT/hostcnn-final.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T)"
