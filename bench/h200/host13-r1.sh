#!/usr/bin/env bash
# host13 request 1 (issue 7): the plugin's host cost per kernel call on TensorFlow's executor
# thread, branch host13 against main, one H200.
#
# Binaries (release, stripped): .hostrun/main.so = main at 21673d2 (the session's base),
# .hostrun/new.so = branch host13, .hostrun/tfwgpu-bench = branch host13. Variants, each Keras
# run its own process:
#   main    = main.so (main's behaviour);
#   new     = new.so, defaults: the tuner's decisions remembered per call site and shape
#             (TFWGPU_TUNE_MEMO), the fused kernels' pipelines kept in their plans
#             (TFWGPU_KEPT_PIPELINES), the implicit-GEMM hooks made once, the tuner looked up
#             once per device, per-op counters without a lock, output dims on the stack;
#   new_off = new.so with TFWGPU_TUNE_MEMO=0 TFWGPU_KEPT_PIPELINES=0 (only the last four).
# Prediction (written before the run, bench/data/2026-12-01-s12-host13-NOTES.md): our
# callbacks' sum per CNN step (hostlog_path "callbacks (sum)") main ~790 us -> new 650-700 us;
# conv-family calls -8..-12 us each in the replay's per-op host time, fused -0.5..-1 us; the
# Keras step -0.05..-0.15 ms (under the process-to-process spread); the Dense(1) floor unchanged
# within 20 us.
# Request folder: .hostrun/{main.so,new.so,tfwgpu-bench}.gz (gzip -9: the request stays under
# 20 MB), bench/{keras_models,keras_floor,hostlog,hostlog_path,torch_keraslike,torch_models}.py,
# bench/gpu_host.sh, python/tensorflow_wgpu, traces/cnn.trace.gz.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host13.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
gunzip -c traces/cnn.trace.gz > /tmp/cnn-h13.trace
H=/tmp/h13run; mkdir -p $H
for f in main.so new.so tfwgpu-bench; do gunzip -c .hostrun/$f.gz > $H/$f; done
chmod +x $H/tfwgpu-bench
TK="timeout 30 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
V_main=""
V_new=""
V_new_off="TFWGPU_TUNE_MEMO=0 TFWGPU_KEPT_PIPELINES=0"
so() { case $1 in main) echo main.so ;; *) echo new.so ;; esac; }
# Runs "$2" with variant $1's plugin and switches: bench/gpu_host.sh's `run`, with the plugin
# taken from $H (the request folder is not written to).
krun() {
  eval "e=\$V_$1"
  (
    sp=/tmp/w/site-packages
    mkdir -p $sp/tensorflow-plugins
    cp $H/$(so $1) $sp/tensorflow-plugins/libtfwgpu_plugin.so
    rm -rf $sp/tensorflow_wgpu && cp -r python/tensorflow_wgpu $sp/
    echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
    mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
    echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
    export PYTHONPATH=$sp:/tmp/tf/site-packages
    export TF_CPP_MIN_LOG_LEVEL=2
    bash -c "env $e $2"
  )
}
replay() {
  eval "e=\$V_$1"
  echo "== replay cnn ($1) $(date +%T)"
  env $e timeout 40 $H/tfwgpu-bench replay /tmp/cnn-h13.trace --repeat 7 --top 30 --json $L/replay-$1.json > $L/replay-$1.txt 2>&1
  grep -E 'steps "(train|infer)_step":|Conv|MatMul|Fused|host time of all' $L/replay-$1.txt
}
# 1. The runtime's host time per kernel call without TensorFlow (per-op median), switches
#    off/on/off/on (the first pass of the first run tunes).
replay new_off; replay new; replay new_off; replay new
# 2. Host-logged Keras CNN training: our callbacks per op and per step, main/new alternated.
hlog() {
  echo "== host log: $1 ($2) $(date +%T)"
  krun $1 "TFWGPU_HOST_LOG=/tmp/hl-$1-$2.json TFWGPU_HOST_TIMERS=1 timeout 25 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1 --json $L/budget-$1-$2.json > $L/budget-$1-$2.txt 2>&1; grep -E 'ms/step|cb.calls' $L/budget-$1-$2.txt | head -2 | cut -c1-240"
  python3 bench/hostlog_path.py /tmp/hl-$1-$2.json --json $L/path-$1-$2.json > $L/path-$1-$2.txt 2>&1
  python3 bench/hostlog.py /tmp/hl-$1-$2.json --json $L/hostlog-$1-$2.json > $L/hostlog-$1-$2.txt 2>&1
  gzip -c /tmp/hl-$1-$2.json > $L/hl-$1-$2.json.gz; rm -f /tmp/hl-$1-$2.json
  grep -E "callbacks|ops |step " $L/path-$1-$2.txt
}
hlog main 1; hlog new 1
left 120 && { hlog main 2; hlog new 2; }
# 3. Keras CNN timing against PyTorch, interleaved (PyTorch first each round).
for r in 1 2; do
  left 140 || { echo "(time: skipped round $r)"; break; }
  echo "-- round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in main new new_off; do
    left 160 || break
    krun $v "echo -n '$v r$r: '; $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
# 4. TensorFlow's floor (Dense(1) fit), host-logged on our device, main then new.
for v in main new; do
  left 168 || { echo "(time: skipped floor $v)"; break; }
  echo "== floor $v $(date +%T)"
  krun $v "TFWGPU_HOST_LOG=/tmp/hl-floor-$v.json timeout 12 python3 bench/keras_floor.py --devices /GPU:0 --steps 300 --json $L/floor-$v.json 2>&1 | grep -E 'fit Dense'"
  gzip -c /tmp/hl-floor-$v.json > $L/hl-floor-$v.json.gz 2>/dev/null; rm -f /tmp/hl-floor-$v.json
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-*.txt 2>/dev/null
grep -h "callbacks (sum)" $L/path-*.txt 2>/dev/null
