# Session 22, request demo22-r3 (issue 7): Keras ResNet-50 (keras.applications, batch 64, SGD
# with momentum, `metrics=["accuracy"]`, a `.batch(64)` dataset: unknown batch size), as users
# train it, this session's plugin and package (new) against the session's starting ones
# (3e3a2fb, old), alternating N O N O, one process each: bench/keras_fit_reads.py --models
# resnet50 (warm-up fit of 3 steps, timed fit of 15). TensorFlow staged first.
#
# Prediction (written before the run): reads per step new 2, old ~108 (each of the 53 batch
# norms reads GatherV2(Shape(x)) back in its forward and gradient, the pooling gradient's Shape
# copies x, the accuracy's Less); ms per step new 76-90 (session 13's Keras ResNet-50 step with
# static shapes: 76.2 ms), old 10-30 ms more (each read waits for the GPU's queue to drain, and
# the host records nothing while it waits). Rule: the figures go to RESULTS as measured.
source bench/h200/lib.sh
gunzip -f .hostrun/old/*.gz
bash bench/gpu_host.sh run "
w=/tmp/w/site-packages
use() { cp \$1/libtfwgpu_plugin.so \$w/tensorflow-plugins/ && rm -rf \$w/tensorflow_wgpu && cp -r \$2 \$w/; }
for r in 1 2; do
  use .hostrun python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models resnet50 --warmup 3 --steps 15 --json $L/r50-new-\$r.json > $L/r50-new-\$r.log 2>&1
  use .hostrun/old .hostrun/old/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models resnet50 --warmup 3 --steps 15 --json $L/r50-old-\$r.json > $L/r50-old-\$r.log 2>&1
done
"
for f in "$L"/r50-*.log; do echo "== $f"; grep -E '^resnet50 ' "$f" | cut -c1-400; done
tar czf "$OUT/demo22-r3.tgz" -C "$OUT" logs
