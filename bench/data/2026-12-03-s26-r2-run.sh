# Session 26, request s26-r2 (issue 7 / issue 6's float16 path): where Keras mixed precision's
# ResNet-50 step goes. s26-r1 measured mixed_float16 at 70-74 ms per step against 77 ms for
# float32 (predicted 35-50). Traces of both Keras steps captured here (batch 64, 2 steps each,
# bench/keras_models.py --trace), each replayed (`tfwgpu-bench replay --top 40`: GPU time per op
# type from timestamps, host time per op); PyTorch's float16 ResNet-50 (timed out in r1).
#
# Prediction (written before the run): the replayed mixed step's GPU busy time is dominated
# not by the convolutions (on tensor cores) but by memory-bound kernels: the f16 -> f32 casts
# and float32 moments of Keras's batch norm, the separate (unfused) float16 Relu/ReluGrad and
# ~420 IsFinite/All kernels of the loss scale's finite check; convolutions <= 45% of GPU time in
# mixed against >= 60% in float32. PyTorch f16 ResNet-50 train 22-35 ms.
source bench/h200/lib.sh
run() { timeout "$1" bash bench/gpu_host.sh run "$2" || echo "exit $? for: $2"; }
run 150 "python3 bench/keras_models.py --models resnet50 --mixed --trace $L/tmix --trace-steps 2 > $L/tmix.log 2>&1"
run 150 "python3 bench/keras_models.py --models resnet50 --trace $L/t32 --trace-steps 2 > $L/t32.log 2>&1"
for t in tmix t32; do
  run 90 "$B replay $L/$t/resnet50.trace --repeat 3 --top 40 --json $L/$t-replay.json > $L/$t-replay.log 2>&1"
done
run 100 "python3 bench/torch_models.py --models resnet50 --modes f16 --feed pageable --steps 30 --warmup 10 --json $L/torch16.json > $L/torch16.log 2>&1"
for f in tmix t32 tmix-replay t32-replay torch16; do echo "== $f"; grep -v -i "warning\|I0000\|W0000\|self.data_adapter" "$L/$f.log" | tail -60; done
tar czf "$OUT/s26-r2.tgz" -C "$OUT" logs
