#!/usr/bin/env bash
# peer13 request 1 (issue 8): Keras MirroredStrategy with copies between the GPUs through a
# peer route (TFWGPU_PEER=1: a ring of host memory both GPUs import, the destination's queue
# ordered after the source's by a shared OPAQUE_FD timeline semaphore, nothing waited for on the
# host) against the copier threads (main's default: the host reads the source back, then writes
# the destination; the stream's later events wait for that). Best on the two-H200 host; on one
# H200 it runs two logical devices of it (TFWGPU_VISIBLE_DEVICES=0,0: the plumbing, not scaling).
# Needs TensorFlow staged (bench/gpu_host.sh) and carries .gl, .hostrun/ (release plugin and
# tfwgpu-bench of the merged tree, stripped).
# Part 1 (correctness on the GPUs, ~20 s): a ping-pong chain of copies with arithmetic on both
# devices (as python/tests/test_multi_device.py's ordered-copies test), exact against NumPy, and
# the routes' report (GPU-ordered or not, host waits); MirroredStrategy fit 2 epochs: the
# replicas' trainable weights identical after every step.
# Part 2: mirrored.py --per-gpu-batch 256 --steps 150, default vs TFWGPU_PEER=1, alternated,
# three processes each (one GPU and two GPUs in each process).
# PREDICTION (written before the run): every check exact, routes GPU-ordered with 0 host waits.
# Two GPUs / one: default 1.05-1.3x (as sessions 9-10), peer 1.3-1.6x: the host no longer sits
# out the GPU's lag in the middle of the step (ReductionToOneDevice's copies need the backward
# pass executed; with the route only the GPUs wait), but each copy still submits the source's
# open batch (~0.1 ms of host per copy, 4-8 per step) and the destination's queue stalls until
# the source's backward pass is done. Decision: if peer is ahead in all three pairs and checks
# pass, the plugin opens devices with TFWGPU_PEER by default where there are several tfwgpu
# GPUs with the extensions (a follow-up change), else it stays opt-in.
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
J=$OUT/json; mkdir -p $J
NG=$(nvidia-smi -L | wc -l)
nvidia-smi -L
if [ "$NG" -lt 2 ]; then
  echo "!! ONLY $NG GPU: two logical devices on one H200 (TFWGPU_VISIBLE_DEVICES=0,0): NOT two-GPU scaling"
  export TFWGPU_VISIBLE_DEVICES=0,0
fi
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
cat > /tmp/peer_check.py <<'PY'
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_wgpu
import keras
from tensorflow_wgpu import models
rng = np.random.default_rng(5)
a = rng.standard_normal((1024, 257)).astype(np.float32)
want = a.copy()
for i in range(20):
    want = (want * 2.0 + i - 1.0) * 0.25
@tf.function
def f(x):
    for i in range(20):
        with tf.device("/GPU:1"):
            x = tf.identity(x) * 2.0 + float(i)
        with tf.device("/GPU:0"):
            x = (tf.identity(x) - 1.0) * 0.25
    return x
errs = []
for _ in range(20):
    with tf.device("/GPU:0"):
        y = f(tf.constant(a))
    errs.append(float(np.max(np.abs(y.numpy() - want))))
# Synthetic Fashion-MNIST-shaped data (the GPU host has no dataset package).
x = rng.random((512, 28, 28, 1), dtype=np.float32)
yl = rng.integers(0, 10, 512).astype(np.int32)
same = []
class Same(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        for v in self.model.trainable_weights:
            vals = [t.numpy() for t in v.value.values]
            same.append(all(np.array_equal(vals[0], o) for o in vals[1:]))
with tf.distribute.MirroredStrategy(["/GPU:0", "/GPU:1"]).scope():
    m, opt, logits = models.build(keras, "cnn")
    m.compile(optimizer=opt, loss=models.loss_fn(keras, logits))
h = m.fit(x, yl, batch_size=128, epochs=2, verbose=0, callbacks=[Same()])
print(json.dumps({"chain_max_err": max(errs), "tol": 20e-6 * float(np.max(np.abs(want))),
                  "replicas_identical": all(same), "steps": len(same), "loss": h.history["loss"],
                  "between": tensorflow_wgpu.stats()["between_devices"]}))
PY
for p in "" 1; do
  echo "-- check peer=${p:-off} $(date +%T)"
  TFWGPU_PEER=$p timeout 60 bash bench/gpu_host.sh run "python3 /tmp/peer_check.py" > $OUT/check-${p:-off}.log 2>&1
  echo "rc=$?" >> $OUT/check-${p:-off}.log
  tail -2 $OUT/check-${p:-off}.log | cut -c1-1500
done
keras() {  # name limit env...
  local name=$1 lim=$2; shift 2
  left $((280 - lim)) || { echo "(time: skipped keras $name)"; return; }
  echo "-- keras $name $(date +%T)"
  env "$@" TFWGPU_TUNE_CACHE=/tmp/tune-peer13.json timeout $lim bash bench/gpu_host.sh run \
    "python3 bench/mirrored.py --per-gpu-batch 256 --steps 150 --json $J/keras-$name.json" > $OUT/keras-$name.log 2>&1
  grep -E '"images_per_s"|step_ms_median|"speedup"|Error|error' $OUT/keras-$name.log | tr -s ' ' | tr '\n' ' '; echo
}
for r in ${KERAS_ROUNDS-a b c}; do
  keras default-$r 45 TFWGPU_PEER=
  keras peer-$r 45 TFWGPU_PEER=1
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s), $NG GPU(s)"
for f in $J/keras-*.json; do python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f'{sys.argv[1].split("/")[-1]:24s} one {d["one"]["images_per_s"]:.0f}/s two {d["all"]["images_per_s"]:.0f}/s = {d["speedup"]:.2f}x')
PY
done
tar czf $OUT/peer13-r1.tar.gz -C $OUT json $(cd $OUT && ls *.log) 2>/dev/null
