#!/usr/bin/env bash
# dual9 request 2 (issue 8): copy gates, now LAZY (the write of a copy between devices is
# recorded behind a gate only when the destination first touches its range; untouched copies
# land as plain uploads), TFWGPU_COPY_GATES=1|0, two-GPU Keras step.
# NEEDS TensorFlow 2.21 + Keras staged in /tmp/site, and the x2 host (two H200s).
# Self-contained: own release plugin (branch dual9, stripped) in /tmp/dual9/site-packages
# (does not touch /tmp/w). <= 120 s in all: every step under timeout, later steps skipped when
# they would not fit. Output: console.log; $OUT/dual9-r2.tar.gz (JSON, timeline, a trace).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/dual9-json2; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 8 ./tfwgpu-bench devices 2>&1 | head -1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader 2>/dev/null | head -2
zcat mirrored-cnn-2dev.trace.gz > /tmp/dual9-m2.trace
for g in 1 0; do
  echo "-- replay 2-dev trace (ring; 1gpu and 2gpu steps), TFWGPU_COPY_GATES=$g $(date +%T)"
  TFWGPU_COPY_GATES=$g timeout 16 ./tfwgpu-bench replay /tmp/dual9-m2.trace --per-device --repeat 3 --json $J/replay-g$g.json 2>&1 | grep -E "wall median|against|2gpu|1gpu" | head -6
done
if [ ! -d /tmp/site/tensorflow ]; then echo "NO TENSORFLOW in /tmp/site: Keras parts skipped"; else
sp=/tmp/dual9/site-packages
rm -rf /tmp/dual9; mkdir -p $sp/tensorflow-plugins
cp libtfwgpu_plugin.so $sp/tensorflow-plugins/
cp -r tensorflow_wgpu $sp/
echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
export PYTHONPATH=$sp:/tmp/tf/site-packages
export TF_CPP_MIN_LOG_LEVEL=2
M="python3 mirrored.py --per-gpu-batch 256 --steps 150"
run() {  # name limit env... -- args...   (skipped unless it fits in 118 s)
  local name=$1 lim=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  left $((118 - lim)) || { echo "(time: skipped $name)"; return; }
  echo "-- $name $(date +%T)"
  env "${envs[@]}" timeout $lim $M --json $J/$name.json "$@" 2>&1 \
    | grep -E '"images_per_s"|step_ms_median|"speedup"' | tr -s ' ' | tr '\n' ' '; echo
}
echo "== mirrored.py (default all-reduce = ReductionToOneDevice), gates on/off alternated"
run gates1-a 25 TFWGPU_COPY_GATES=1 --
run gates0-a 25 TFWGPU_COPY_GATES=0 --
run gates1-b 19 TFWGPU_COPY_GATES=1 -- --only all
run gates0-b 19 TFWGPU_COPY_GATES=0 -- --only all
if left 100; then
  echo "-- traced 15 two-GPU steps, TFWGPU_COPY_GATES=1 $(date +%T)"
  TFWGPU_COPY_GATES=1 TFWGPU_TRACE=/tmp/dual9/t1.trace timeout 17 python3 mirrored.py --per-gpu-batch 256 --steps 15 --skip 2 --only all > /dev/null 2>&1
  if [ -f /tmp/dual9/t1.trace ]; then
    timeout 6 python3 dual_timeline.py /tmp/dual9/t1.trace --json $J/timeline-g1.json > $J/timeline-g1.txt 2>&1
    grep -E "^2gpu|milestones|dev [01]:|issue to" $J/timeline-g1.txt
    gzip -c /tmp/dual9/t1.trace > $J/mirrored-g1.trace.gz
  fi
fi
run thread1-g0 19 TFWGPU_COPY_GATES=0 TFWGPU_SUBMIT_THREAD=1 -- --only all
fi
tar -czf $OUT/dual9-r2.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T) ($(( $(date +%s) - T0 )) s)"
