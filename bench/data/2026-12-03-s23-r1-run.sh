# Session 23, request s23-r1 (issue 7): Keras training steps as users write them
# (bench/keras_fit_reads.py, batch 64, `metrics=["accuracy"]`, `.batch(64)` datasets), this
# session's plugin and Python package (new: Einsum on the GPU; loop conditions on the host;
# a host mirror of 4096 entries) against the session's starting ones (old: 1729a9a's plugin,
# behaviour of f81b872), alternating N O N O, one process each, models mha, lstm, gru (the
# changes) and cnn, resnet, embed (unchanged paths: regressions only). TensorFlow staged first.
#
# Prediction (written before the run): reads per step new / old: mha 2 / 8 (the attention's
# Einsums ran on the CPU: six copies to the host, the rest of the layer on the GPU), lstm 2-3 /
# 41, gru 2-3 / 166, cnn, resnet, embed 2 / 2; ms per step new / old: mha 4-6 / 8-9, lstm 8-14 /
# 21-24, gru 10-20 / 37-40 (each iteration's read drained the GPU queue; what is left is the
# executor's per-op cost of ~1,000 kernels and the loops' control flow), cnn, resnet, embed
# within +-10% of old in the same round. Same losses new and old within float32 summation
# order (mha: the CPU's einsum against ours). Rules: the figures go to RESULTS as measured;
# a model new slower than old in both rounds by more than 10% is investigated before the
# session ends.
source bench/h200/lib.sh
gunzip -f .hostrun/old/*.gz
bash bench/gpu_host.sh run "
w=/tmp/w/site-packages
use() { cp \$1/libtfwgpu_plugin.so \$w/tensorflow-plugins/ && rm -rf \$w/tensorflow_wgpu && cp -r \$2 \$w/; }
for r in 1 2; do
  use .hostrun python/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models mha,lstm,gru,cnn,resnet,embed --steps 40 --json $L/reads-new-\$r.json > $L/reads-new-\$r.log 2>&1
  use .hostrun/old .hostrun/old/tensorflow_wgpu && python3 bench/keras_fit_reads.py --models mha,lstm,gru,cnn,resnet,embed --steps 40 --json $L/reads-old-\$r.json > $L/reads-old-\$r.log 2>&1
done
"
for f in "$L"/reads-*.log; do echo "== $f"; grep -E '^(mha|lstm|gru|cnn|resnet|embed) ' "$f"; tail -2 "$f" | grep -i error; done
tar czf "$OUT/s23-r1.tgz" -C "$OUT" logs
