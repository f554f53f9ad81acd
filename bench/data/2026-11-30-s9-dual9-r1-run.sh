#!/usr/bin/env bash
# dual9 request 1 (issue 8): copy gates (TFWGPU_COPY_GATES=1|0) for the two-GPU Keras step.
# NEEDS TensorFlow 2.21 + Keras staged in /tmp/site, and the x2 host (two H200s).
# Self-contained: own release plugin (branch dual9, stripped) in /tmp/dual9/site-packages
# (does not touch /tmp/w). <= 150 s in all: every step under timeout, later steps skipped
# past 140 s. Output: console.log; $OUT/dual9-r1.tar.gz (JSON, timelines, small).
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt ${1:-140} ]; }
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f ../../.gl/activate.sh ]; then source ../../.gl/activate.sh; fi
gunzip -kf libtfwgpu_plugin.so.gz tfwgpu-bench.gz && chmod +x tfwgpu-bench
J=/tmp/dual9-json; rm -rf $J; mkdir -p $J
echo "== devices $(date +%T)"; timeout 10 ./tfwgpu-bench devices 2>&1 | head -3
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader 2>/dev/null | head -2
zcat mirrored-cnn-2dev.trace.gz > /tmp/dual9-m2.trace
R="timeout 15 ./tfwgpu-bench replay /tmp/dual9-m2.trace --per-device --repeat 3"
for g in 1 0; do
  echo "-- replay 2-dev trace (ring; 1gpu and 2gpu steps), TFWGPU_COPY_GATES=$g $(date +%T)"
  TFWGPU_COPY_GATES=$g $R --json $J/replay-g$g.json 2>&1 | grep -E "wall median|against|2gpu|1gpu" | head -6
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
run() {  # name limit env... -- args...   (skipped unless it fits in 148 s)
  local name=$1 lim=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  left $((148 - lim)) || { echo "(time: skipped $name)"; return; }
  echo "-- $name $(date +%T)"
  env "${envs[@]}" timeout $lim $M --json $J/$name.json "$@" 2>&1 \
    | grep -E '"images_per_s"|step_ms_median|"speedup"' | tr -s ' ' | tr '\n' ' '; echo
}
traced() {  # gates
  left 130 || { echo "(time: skipped trace g$1)"; return; }
  echo "-- traced 15 two-GPU steps, TFWGPU_COPY_GATES=$1 $(date +%T)"
  TFWGPU_COPY_GATES=$1 TFWGPU_TRACE=/tmp/dual9/t$1.trace timeout 18 python3 mirrored.py --per-gpu-batch 256 --steps 15 --skip 2 --only all > /dev/null 2>&1
  [ -f /tmp/dual9/t$1.trace ] && timeout 8 python3 dual_timeline.py /tmp/dual9/t$1.trace --json $J/timeline-g$1.json > $J/timeline-g$1.txt 2>&1 && grep -E "^2gpu|milestones|dev [01]:|issue to" $J/timeline-g$1.txt
  [ "$1" = 1 ] && [ -f /tmp/dual9/t1.trace ] && gzip -c /tmp/dual9/t1.trace > $J/mirrored-g1.trace.gz
}
echo "== mirrored.py (default all-reduce = ReductionToOneDevice), gates on/off alternated"
run gates1-a 24 TFWGPU_COPY_GATES=1 --
run gates0-a 24 TFWGPU_COPY_GATES=0 --
run gates1-b 19 TFWGPU_COPY_GATES=1 -- --only all
traced 1
run thread1-g1 19 TFWGPU_COPY_GATES=1 TFWGPU_SUBMIT_THREAD=1 -- --only all
run collective-pack-g1 19 TFWGPU_COPY_GATES=1 -- --only all --cross-device-ops collective --bytes-per-pack 131072
traced 0
run gates0-b 19 TFWGPU_COPY_GATES=0 -- --only all
fi
tar -czf $OUT/dual9-r1.tar.gz -C $J .
ls -la $OUT; echo "done $(date +%T) ($(( $(date +%s) - T0 )) s)"
