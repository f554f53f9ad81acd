#!/usr/bin/env bash
# host13 request 2 (issue 7): request 1's A/B again with more host-logged pairs, PyTorch in
# every round, the small writes as dispatches (opt-in), and TensorFlow's floor on both devices.
#
# Binaries (release, stripped, gzip -9): .hostrun/main.so = main at 21673d2 (the session's base),
# .hostrun/new.so = branch host13 at 998d05f. Variants, each Keras run its own process:
#   main  = main.so (main's behaviour);
#   new   = new.so, defaults (request 1's changes + the fused check kept per input shapes and
#           the reduce family's scalar pipeline looked up only where used);
#   neww  = new.so + TFWGPU_WRITE_DISPATCH_BYTES=256 (host writes <= 256 bytes as one dispatch
#           carrying the bytes, inside the open compute pass: no arena copy, no pass break, no
#           byte-masked tail fill).
# Prediction (bench/data/2026-12-01-s12-host13-NOTES.md, written before the run): callbacks'
# sum per step main ~890-970 us (request 1) -> new 740-790 us; neww: the uploads on the
# executor threads ("(htod on executor)", 6 per step, 11-12 us each) -> 5-8 us each, callbacks
# -20..-40 us more; Dense(1) floor: new = main within the spread (+-0.15 ms); our device's extra
# over TensorFlow's CPU device 0.6-1.0 ms, of which our spans on the critical path ~0.3 ms.
# Request folder: .hostrun/{main.so,new.so}.gz, bench/{keras_models,keras_floor,hostlog,
# hostlog_path,torch_keraslike,torch_models}.py, python/tensorflow_wgpu.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-host13.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
H=/tmp/h13run2; mkdir -p $H
for f in main.so new.so; do gunzip -c .hostrun/$f.gz > $H/$f; done
TK="timeout 30 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
V_main=""
V_new=""
V_neww="TFWGPU_WRITE_DISPATCH_BYTES=256"
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
# A host-logged Keras CNN training run (its wall ms/step and the plugin's counters too).
hlog() {
  echo "== host log: $1 ($2) $(date +%T)"
  krun $1 "TFWGPU_HOST_LOG=/tmp/hl-$1-$2.json timeout 25 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1 --json $L/budget-$1-$2.json > $L/budget-$1-$2.txt 2>&1; grep -E 'ms/step' $L/budget-$1-$2.txt | head -1 | cut -c1-150"
  python3 bench/hostlog_path.py /tmp/hl-$1-$2.json --json $L/path-$1-$2.json > $L/path-$1-$2.txt 2>&1
  gzip -c /tmp/hl-$1-$2.json > $L/hl-$1-$2.json.gz; rm -f /tmp/hl-$1-$2.json
  grep -E "callbacks|ops |step " $L/path-$1-$2.txt
}
# 1. Rounds: PyTorch like for like, then main / new / neww host-logged (order rotated).
order=("main new neww" "new neww main" "neww main new")
round() {
  local r=$1
  echo "-- round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in ${order[$((r-1))]}; do
    left 164 || { echo "(time: skipped $v r$r)"; break; }
    hlog $v $r
  done
}
round 1
left 110 && round 2
# 2. TensorFlow's floor: Dense(1) fit on our device, host-logged (new, then main), then on
#    TensorFlow's CPU device (a process of its own: keras_floor.py resets the host log per device).
for v in new main; do
  left 150 || { echo "(time: skipped floor $v)"; break; }
  echo "== floor $v $(date +%T)"
  krun $v "TFWGPU_HOST_LOG=/tmp/hl-floor-$v.json timeout 16 python3 bench/keras_floor.py --devices /GPU:0 --steps 300 --json $L/floor-$v.json 2>&1 | grep -E 'fit Dense'"
  gzip -c /tmp/hl-floor-$v.json > $L/hl-floor-$v.json.gz 2>/dev/null; rm -f /tmp/hl-floor-$v.json
done
left 160 && { echo "== floor CPU $(date +%T)"; krun new "timeout 16 python3 bench/keras_floor.py --devices /CPU:0 --steps 300 --json $L/floor-cpu.json 2>&1 | grep -E 'fit Dense'"; }
# 3. A third round while time is left.
left 130 && round 3
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-*.txt 2>/dev/null
for f in $L/path-*.txt; do echo "$(basename $f): $(grep -E 'callbacks \(sum\)' $f)"; done
