# Prepared in session 26 (not run), request mixed-ab-r1 (issue 7): two opt-in switches of the
# package's Keras hooks against their defaults, one process each, A / B / A, ResNet-50 (batch 64)
# and the CNN: `TFWGPU_KERAS_FUSED_BN=1` (float32 BatchNormalization as one FusedBatchNormV3,
# against the plugin's fusion of Keras's own float32 graph) and `TFWGPU_FINITE_CHECK=concat`
# (mixed precision's finite check as one concatenation and one reduction, against one fused
# reduction per gradient). Needs TensorFlow staged (bench/gpu_host.sh).
#
# Prediction (to be checked when run): float32 ResNet-50 77 ms -> 70-75 with FUSED_BN (the
# float32 replay's batch-norm kernels ~20 ms of GPU time per step, the fused pair on float32
# ~13); mixed ResNet-50 unchanged within 2% with concat (GPU-bound), mixed CNN 5.4-5.9 ->
# 5.0-5.5 ms (7 kernel calls fewer per step on a host-bound step).
source bench/h200/lib.sh
run() { timeout "$1" bash bench/gpu_host.sh run "$2" || echo "exit $? for: $2"; }
K="python3 bench/keras_models.py --models cnn,resnet50 --resnet50-steps 15 --resnet50-warmup 3"
run 100 "$K --json $L/f32-a1.json > $L/f32-a1.log 2>&1"
run 100 "TFWGPU_KERAS_FUSED_BN=1 $K --json $L/f32-b.json > $L/f32-b.log 2>&1"
run 100 "$K --json $L/f32-a2.json > $L/f32-a2.log 2>&1"
run 100 "$K --mixed --json $L/mix-a1.json > $L/mix-a1.log 2>&1"
run 100 "TFWGPU_FINITE_CHECK=concat $K --mixed --json $L/mix-b.json > $L/mix-b.log 2>&1"
run 100 "$K --mixed --json $L/mix-a2.json > $L/mix-a2.log 2>&1"
for f in f32-a1 f32-b f32-a2 mix-a1 mix-b mix-a2; do echo "== $f"; grep "batch  64" "$L/$f.log"; done
tar czf "$OUT/mixed-ab-r1.tgz" -C "$OUT" logs
