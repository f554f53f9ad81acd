# Session 22, request demo22-r2 (issue 7): (1) reads of the GPU inside Keras training steps as
# users write them (`metrics=["accuracy"]`, `.batch(64)`: unknown batch size), this session's
# plugin and Python package against the session's starting ones (3e3a2fb), alternating N O N O, one process each,
# bench/keras_fit_reads.py: the reference cnn and resnet, an Embedding model, LSTM(64) and GRU(64); (2) the demo's
# own table with this session's plugin and demo.py (which now times a second `evaluate`),
# twice. TensorFlow staged first; the Fashion-MNIST IDX files staged into /tmp/data.
#
# Prediction (written before the run): reads per step new / old: cnn 2 / 4 (batch norm's two
# GatherV2 of Shape(x) read back), resnet 2 / 8 (four GatherV2, the pooling gradient's Shape
# on the CPU copying x, the accuracy's Less), embed 3 / 7 (UnsortedSegmentSum on the CPU: the
# gradient's rows and ids read back; one read stays: Keras's id remap, an int32 SelectV2 on the
# GPU, feeds a host-memory Reshape), lstm 42 / fails, gru 170 / fails (old:
# "No OpKernel ... CudnnRNNV3"; the counts as on lavapipe); ms per step cnn -0.2 to -0.6, resnet
# -0.5 to -2, embed -0.2 to -1 (new against old, in both pairs); lstm 8-12 ms, gru 15-25 ms per step (each loop
# iteration reads its condition from the GPU). Demo: training as in demo22-r1 (GPU 28k-32k
# images/s, CPU 15k-17k, 1.7-2.1x); inference (second evaluate) GPU 50k-150k images/s, CPU
# 33k-40k, 1.3-4x. Rules: README's demo row takes the median of the two demo runs; the
# keras_fit_reads figures go to RESULTS as measured (the changes stay: they remove waits and
# give TensorFlow's CPU results, tested).
source bench/h200/lib.sh
gunzip -f .hostrun/old/*.gz
bash bench/gpu_host.sh run "
w=/tmp/w/site-packages
use() { cp \$1/libtfwgpu_plugin.so \$w/tensorflow-plugins/ && rm -rf \$w/tensorflow_wgpu && cp -r \$2 \$w/; }
for r in 1 2; do
  use .hostrun python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --steps 40 --json $L/reads-new-\$r.json > $L/reads-new-\$r.log 2>&1
  use .hostrun/old .hostrun/old/tensorflow_wgpu && python3 bench/keras_fit_reads.py --steps 40 --json $L/reads-old-\$r.json > $L/reads-old-\$r.log 2>&1
done
use .hostrun python/tensorflow_wgpu
for r in 1 2; do python3 -m tensorflow_wgpu.demo --data-dir /tmp/data --compare-cpu > $L/demo-\$r.log 2>&1; done
"
for f in "$L"/reads-*.log; do echo "== $f"; grep -E '^(cnn|resnet|embed|lstm|gru) ' "$f"; done
for r in 1 2; do echo "== demo $r"; grep -v 'ETA\|step - \|^Epoch\|absl\|oneDNN' "$L/demo-$r.log" | tail -7; done
tar czf "$OUT/demo22-r2.tgz" -C "$OUT" logs
