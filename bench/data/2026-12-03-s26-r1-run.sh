# Session 26, request s26-r1 (issue 7, issue 6's float16 path end to end): Keras mixed precision
# (policy mixed_float16: float16 activations and convolutions on the tensor cores through
# cooperative matrices, float32 variables, Keras's LossScaleOptimizer) against Keras float32 and
# PyTorch (float32 TF32 off, TF32, and float16 autocast + GradScaler), keras.applications
# ResNet50 batch 64 and the reference CNN batch 64; never measured before. One process per
# framework and mode, in the order K32, Kmix, T (all modes), Kmix. TensorFlow staged first.
#
# Prediction (written before the run): Keras float32 ResNet-50 train 76-85 ms (s7/s22), mixed
# 35-50 ms (the convolutions 1.8-4x faster on tensor cores, memory-bound ops on half the bytes,
# ~30% more kernel calls for casts and loss scaling); PyTorch f16 25-35 ms; Keras mixed /
# PyTorch f16 1.3-2.0x. CNN: host-bound, mixed no faster than float32 (2.4-3.0 ms), 1 read more
# per step (the loss scale's finite check).
source bench/h200/lib.sh
run() { timeout "$1" bash bench/gpu_host.sh run "$2" || echo "exit $? for: $2"; }
run 170 "python3 bench/keras_models.py --models cnn,resnet50 --resnet50-steps 20 --resnet50-warmup 3 --json $L/k32.json > $L/k32.log 2>&1"
run 170 "python3 bench/keras_models.py --models cnn,resnet50 --resnet50-steps 20 --resnet50-warmup 3 --mixed --json $L/kmix.json > $L/kmix.log 2>&1"
run 120 "python3 bench/torch_models.py --models cnn,resnet50 --modes f32,tf32,f16 --feed pageable --json $L/torch.json > $L/torch.log 2>&1"
run 120 "python3 bench/keras_models.py --models cnn,resnet50 --resnet50-steps 20 --resnet50-warmup 3 --mixed --json $L/kmix2.json > $L/kmix2.log 2>&1"
for f in k32 kmix torch kmix2; do echo "== $f"; grep -v -i "warning\|I0000\|W0000\|self.data_adapter" "$L/$f.log" | tail -12; done
tar czf "$OUT/s26-r1.tgz" -C "$OUT" logs
