#!/usr/bin/env bash
# Session 21 (issues 7 and 6), after TensorFlow is staged again (bench/gpu_host.sh); carry .gl,
# .hostrun (release plugin and bench of this session: conv chooser v11, dispatch trace).
# 1. TensorFlow's per-call floor against PyTorch's whole call, in one process, blocks interleaved
#    (bench/infer_interleaved.py --identity): the CNN's inference tf.function, an identity
#    tf.function on the same device input, PyTorch's CNN under inference_mode. call21-r1: the
#    call's 7 callbacks take ~48-65 us and ~170 us lie outside them, about an identity call.
#    PREDICTION: keras_identity / torch 0.9-1.3x per round; keras / torch 1.5-1.9x.
#    DECISION: if the identity call alone is >= 1.0x PyTorch's call in most rounds of both
#    processes, the 1.3x inference goal needs the kernels' whole share within 0.3x of PyTorch's
#    call (~40-55 us here): say so in issue 7 and weigh the callbacks' cuts against that.
# 2. Which dispatches the replayed CNN inference records on the H200 (TFWGPU_LOG trace target
#    tfwgpu_dispatch): the Conv2D callback recorded two there (one on lavapipe).
# 3. Conv chooser v11 (occ21-r1's rule, taken with r50_28 forward at -4.0/-4.2% against the
#    rule's 5%): the auto pick on the four long-K forwards should run at the forced tile's
#    figures of occ21-r1 (busy 0.060 / 0.064 / 0.034 / 0.035 ms), input gradients unchanged.
source bench/h200/lib.sh
for k in 1 2; do
  echo "-- interleaved $k $(date +%T)"
  bash bench/gpu_host.sh run "timeout 200 python3 bench/infer_interleaved.py --identity --calls 300 --rounds 9 --json $L/interleaved-$k.json 2>&1 | grep -E '^round|^medians|^keras'"
done
echo "-- replay dispatches $(date +%T)"
TFWGPU_LOG=tfwgpu_dispatch=trace timeout 60 $B replay bench/traces/cnn.trace.gz --repeat 1 > $L/replay-dispatch.txt 2>&1
grep -a -A12 "infer_step" $L/replay-dispatch.txt | head -5
grep -a "tfwgpu_dispatch" $L/replay-dispatch.txt | sed 's/.*tfwgpu_dispatch[^ ]* //' | tail -24
echo "-- conv v11 $(date +%T)"
TFWGPU_TUNE_CACHE=/tmp/tune-v11.json timeout 100 $B conv --dtype f16 --cases gemm_28_1x1_1152_128,gemm_7_1x1_4608_512,r50_28_1x1_512_128,r50_7_1x1_2048_512 --ops fwd,bwd_input --reps 3 --sample-ms 10 --json $L/v11.json > $L/v11.txt 2>&1
grep -E "fwd|bwd|WRONG|error" $L/v11.txt
echo "== done $(date +%T)"
tar czf $OUT/call21-r2-logs.tgz -C $OUT logs
