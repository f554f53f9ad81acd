# Prepared in session 26 (not run: the session's device time was spent), request biasgrad-r1 (issue 6, memory-bound kernels in float16): BiasAddGrad (NHWC
# per-channel sums) in float32 and float16 on ResNet-50's shapes, ours (`tfwgpu-bench ops`, new
# cases) and PyTorch's (torch.sum over N, H, W) in the same call, against the copy. Session 26's
# replayed Keras mixed step had float16 BiasAddGrad at 2.5x float32's GPU time (16.2 against
# 6.4 ms over the pass) although it reads half the bytes.
#
# Prediction (written before the run): our float32 rows at 40-70% of the copy; our float16 rows
# 1.5-2.5x the float32 rows' time (10-30% of the copy), the first (prologue) pass holding it;
# PyTorch's rows 60-90% of the copy in both dtypes.
source bench/h200/lib.sh
C=biasgrad_64x112x112x64,biasgrad_64x112x112x64_f16,biasgrad_64x56x56x256,biasgrad_64x56x56x256_f16,biasgrad_64x14x14x1024,biasgrad_64x14x14x1024_f16
timeout 60 $B ops --cases copy_vec4x4_256MiB,$C --reps 5 --json $L/ours.json > $L/ours.log 2>&1 || echo "ours exit $?"
timeout 40 python3 bench/torch_ref.py --cases copy_256MiB,$C --json $L/torch.json > $L/torch.log 2>&1 || echo "torch exit $?"
tail -20 $L/ours.log; tail -12 $L/torch.log
tar czf "$OUT/s26-r4.tgz" -C "$OUT" logs
