#!/usr/bin/env bash
# dual8 request 2 (issue 8): the Keras two-GPU step with branch dual8's changes against main,
# alternated, each in its own process. NEEDS TensorFlow 2.21 + Keras in /tmp/site and the x2
# host. <= ~100 s in total (every run under timeout 24 s). Own plugins in own site dirs
# (/tmp/dual8m: main f890934 as in request 1; /tmp/dual8n: dual8), does not touch /tmp/w.
#   new   = dual8 defaults: batches encoded and submitted outside the batch lock, lock-free
#           event tags, copier threads poll for their source read (2 ms) before blocking
#   main  = request 1's plugin (main f890934)
#   thr   = dual8 + TFWGPU_SUBMIT_THREAD=1 (recording threads hand due batches to a submit
#           thread per device instead of encoding/submitting them inline)
#   new1d = dual8, MirroredStrategy(cross_device_ops=ReductionToOneDevice()), 2 GPUs only
# Output: console.log; $OUT/dual8-r2.tar.gz (JSON).
set -u
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
J=/tmp/dual8-json2; rm -rf $J; mkdir -p $J
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader 2>/dev/null | head -2
if [ ! -d /tmp/site/tensorflow ]; then echo "NO TENSORFLOW in /tmp/site: nothing to run"; exit 0; fi
mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
for v in m n; do
  sp=/tmp/dual8$v/site-packages; rm -rf /tmp/dual8$v; mkdir -p $sp/tensorflow-plugins
  if [ $v = m ]; then gunzip -c main-libtfwgpu_plugin.so.gz > $sp/tensorflow-plugins/libtfwgpu_plugin.so
  else gunzip -c libtfwgpu_plugin.so.gz > $sp/tensorflow-plugins/libtfwgpu_plugin.so; fi
  cp -r tensorflow_wgpu $sp/
  echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
  echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
done
export TF_CPP_MIN_LOG_LEVEL=2
run() {  # name plugin(m|n) env... -- args...
  local name=$1 v=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "== $name $(date +%T)"
  env "${envs[@]}" PYTHONPATH=/tmp/dual8$v/site-packages:/tmp/tf/site-packages timeout 24 \
    python3 mirrored.py --per-gpu-batch 256 --steps 100 --json $J/$name.json "$@" 2>&1 \
    | grep -E '"images_per_s"|step_ms_median|speedup"' | tr -s ' ' | tr '\n' ' '; echo
}
run new n X=1 --
run main m X=1 --
run thr n TFWGPU_SUBMIT_THREAD=1 --
run new1d n X=1 -- --only all --cross-device-ops one_device
run main-2 m X=1 -- --only all
tar -czf $OUT/dual8-r2.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T)"
