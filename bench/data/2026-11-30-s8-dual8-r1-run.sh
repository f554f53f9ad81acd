#!/usr/bin/env bash
# dual8 request 1 (issue 8: why the 2-GPU Keras step is 2x the 1-GPU step). NEEDS TensorFlow
# 2.21 + Keras staged in /tmp/site and the x2 host (two H200s). Self-contained: own plugin
# (release build of branch dual8 = main f890934, stripped) in its own site dir
# /tmp/dual8/site-packages (does not touch /tmp/w). ~3 min, every step under timeout.
# Output: console.log; $OUT/dual8-r1.tar.gz (JSON, logs, a 15-step trace; small).
set -u
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/dual8-json; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 20 ./tfwgpu-bench devices 2>&1 | head -4
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null | head -2
if [ ! -d /tmp/site/tensorflow ]; then echo "NO TENSORFLOW in /tmp/site: nothing to run"; exit 0; fi
sp=/tmp/dual8/site-packages
rm -rf /tmp/dual8; mkdir -p $sp/tensorflow-plugins
cp libtfwgpu_plugin.so $sp/tensorflow-plugins/
cp -r tensorflow_wgpu $sp/
echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
export PYTHONPATH=$sp:/tmp/tf/site-packages
export TF_CPP_MIN_LOG_LEVEL=2
F="grep -v -i -E warn|absl|^W0000|^I0000"
echo "== 1. host overlap of two devices (dual_overlap.py, 200 kernels per device per call) $(date +%T)"
timeout 60 python3 dual_overlap.py --ops 200 --calls 50 --reps 5 --json $J/overlap.json 2>&1 | $F | tail -8
echo "== 2. host budget per step, 1 GPU then 2 GPUs (mirrored.py, TFWGPU_HOST_TIMERS=1) $(date +%T)"
TFWGPU_HOST_TIMERS=1 timeout 70 python3 mirrored.py --per-gpu-batch 256 --steps 150 --host-budget 2 --json $J/budget.json 2>&1 | $F | grep -v '^[{} ]' | tail -12
echo "== 3. throughput, default all-reduce (collective ring), 1 and 2 GPUs $(date +%T)"
timeout 60 python3 mirrored.py --per-gpu-batch 256 --steps 150 --json $J/mirrored-collective.json 2>&1 | grep -E '"images_per_s"|speedup|step_ms_median'
for c in one_device hierarchical; do
  echo "== 3b. throughput, 2 GPUs, --cross-device-ops $c $(date +%T)"
  timeout 45 python3 mirrored.py --per-gpu-batch 256 --steps 150 --only all --cross-device-ops $c --json $J/mirrored-$c.json 2>&1 | grep -E '"images_per_s"|step_ms_median'
done
echo "== 4. trace of 15 steps per setting (TFWGPU_TRACE) $(date +%T)"
TFWGPU_TRACE=/tmp/dual8/mirrored.trace timeout 60 python3 mirrored.py --per-gpu-batch 256 --steps 15 --skip 2 --json $J/mirrored-traced.json 2>&1 | grep -E '"images_per_s"|step_ms_median'
if [ -f /tmp/dual8/mirrored.trace ]; then
  timeout 30 python3 trace_threads.py /tmp/dual8/mirrored.trace --json $J/trace-threads.json 2>&1 | tail -8
  gzip -c /tmp/dual8/mirrored.trace > $J/mirrored.trace.gz; ls -la $J/mirrored.trace.gz
fi
if command -v perf >/dev/null 2>&1; then
  echo "== 5. perf (2 GPUs only, 150 steps) $(date +%T)"
  timeout 60 perf record -e cpu-clock -F 999 -o /tmp/dual8/perf.data -- python3 mirrored.py --per-gpu-batch 256 --steps 150 --only all > /dev/null 2>&1
  timeout 40 perf report -i /tmp/dual8/perf.data --no-children --sort comm,dso --stdio 2>/dev/null | head -60 > $J/perf-comm-dso.txt
  timeout 40 perf report -i /tmp/dual8/perf.data --no-children --sort comm,sym --stdio 2>/dev/null | head -200 > $J/perf-comm-sym.txt
  head -40 $J/perf-comm-dso.txt
else
  echo "== 5. no perf on this host: skipped"
fi
tar -czf $OUT/dual8-r1.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T)"
