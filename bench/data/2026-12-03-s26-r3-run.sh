# Session 26, request s26-r3 (issue 7, mixed precision): Keras mixed_float16 ResNet-50 (batch 64)
# with this session's changes ("new": the loss scale's finite check as one fused reduction per
# gradient, float16 BatchNormalization as FusedBatchNormV3 on the halves, float16 BiasAddGrad
# without a float32 copy) against the plugin and hooks of s26-r1/r2 ("old", carried in
# .hostrun/old), one process each, new / old / new; then a trace of the new mixed step replayed
# (GPU time per op).
#
# Prediction (written before the run): old 70-74 ms per step (as r1); new 50-58 ms (r2's replay:
# the finite check ~10 ms and the casts ~10 ms per step of GPU time, Keras's float32 batch-norm
# passes on float32 copies replaced by float16 FusedBatchNorm passes); the replayed new step's
# GPU busy 38-45 ms; PyTorch f16 (r2) 28.7 ms, so new / PyTorch 1.7-2.0x.
source bench/h200/lib.sh
gunzip -f .hostrun/old/*.gz
run() { timeout "$1" bash bench/gpu_host.sh run "$2" || echo "exit $? for: $2"; }
OLD="cp .hostrun/old/_hooks.py /tmp/w/site-packages/tensorflow_wgpu/_hooks.py && cp .hostrun/old/libtfwgpu_plugin.so /tmp/w/site-packages/tensorflow-plugins/libtfwgpu_plugin.so &&"
K="python3 bench/keras_models.py --models cnn,resnet50 --resnet50-steps 20 --resnet50-warmup 3 --mixed"
run 130 "$K --json $L/new1.json > $L/new1.log 2>&1"
run 130 "$OLD $K --json $L/old.json > $L/old.log 2>&1"
run 130 "$K --json $L/new2.json > $L/new2.log 2>&1"
run 100 "python3 bench/keras_models.py --models resnet50 --mixed --trace $L/tnew --trace-steps 2 > $L/tnew.log 2>&1"
run 60 "$B replay $L/tnew/resnet50.trace --repeat 3 --top 30 --json $L/tnew-replay.json > $L/tnew-replay.log 2>&1"
for f in new1 old new2; do echo "== $f"; grep "batch  64" "$L/$f.log"; done
echo "== tnew-replay"; grep -E "train_step\" \(timed per pass|kernels \(|^  [A-Za-z_(].* +[0-9]+ +[0-9.]+ +[0-9.]+$" "$L/tnew-replay.log" | head -45
tar czf "$OUT/s26-r3.tgz" -C "$OUT" logs
