#!/usr/bin/env bash
# host8 request 1 (issue 7): the Keras CNN step (batch 64) with
#   TFWGPU_SYNC=ordered|completed: TensorFlow's Device::Sync submits and returns (this branch's
#       default) | waits for the GPU (main's behaviour);
#   TFWGPU_PIN_SEEDS=1|0: Keras's dropout-seed arithmetic on the host (this branch's default,
#       so the mid-step seed read-back does not wait for the GPU) | on the GPU (main).
# Per-step host budget (train and inference) for the 4 combinations, alternated, one process
# each; then plain keras_models timing new vs main; PyTorch like for like in the same call.
# NEEDS TensorFlow 2.21 + Keras staged in /tmp/site (as for hostcnn's / lead20's calls).
# Self-contained: own plugin (branch host8, release, stripped) in its own site dir
# /tmp/host8/site-packages (does not touch /tmp/w). ~3.5 min; later steps are skipped past 215 s.
# Output: console.log; $OUT/host8-r1.tar.gz (JSON).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt 215 ]; }
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/host8-json; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 20 ./tfwgpu-bench devices 2>&1 | head -3
echo "== torch like for like (device / pageable / pageable+loss.item) $(date +%T)"
timeout 35 python3 torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 2 --json $J/torch-keraslike.json 2>&1 | tail -3
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
echo "== keras cnn batch 64: host budget (train 200 steps, then inference 200 calls) $(date +%T)"
n=0
for c in ordered:1 completed:0 ordered:0 completed:1 ordered:1 completed:0; do
  left || { echo "(time: skipped the rest)"; break; }
  s=${c%:*}; p=${c#*:}; n=$((n+1)); echo "-- TFWGPU_SYNC=$s TFWGPU_PIN_SEEDS=$p $(date +%T)"
  TFWGPU_SYNC=$s TFWGPU_PIN_SEEDS=$p timeout 35 $K --steps 200 --warmup 10 --host-budget 1 --json $J/budget-$s-pin$p-$n.json 2>&1 | grep -v -i warn | tail -6
done
echo "== keras cnn timing (fit train step / infer step): new defaults, then main's behaviour $(date +%T)"
for c in ordered:1 completed:0; do
  left || { echo "(time: skipped)"; break; }
  s=${c%:*}; p=${c#*:}; echo "-- TFWGPU_SYNC=$s TFWGPU_PIN_SEEDS=$p"
  TFWGPU_SYNC=$s TFWGPU_PIN_SEEDS=$p timeout 30 $K --steps 300 --warmup 10 --json $J/keras-$s-pin$p.json 2>&1 | grep batch
done
fi
tar -czf $OUT/host8-r1.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T) ($(( $(date +%s) - T0 )) s)"
