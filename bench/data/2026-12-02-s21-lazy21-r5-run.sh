#!/usr/bin/env bash
# Session 21 (issue 7), ~1 min on one H200, no TensorFlow; carry .gl, .hostrun (bench before and
# after b688a15: the float32 column paths make their buffers on first use).
# The CNN trace's replay (bench/traces/cnn.trace.gz), old and new binary alternating (A B A B):
# Conv2D's dispatches and host time per call. The first conv (one input channel) asks the tuner
# for its column path; on the H200 the answer is the previous implicit GEMM, and the old binary
# recorded the padded filter's copy and allocated 2 MB of columns anyway (call21-r4's dispatch
# trace: `copy:None:words` before every Conv2D).
# PREDICTION: Conv2D dispatches per call 2 -> 1; its host us/call median -3 to -8 us; GPU busy of
# the replayed inference step within noise (one ~1-2 us copy fewer).
# DECISION: none to take (the change is on main, tested on lavapipe); this checks its effect.
source bench/h200/lib.sh
zcat bench/traces/cnn.trace.gz > /tmp/cnn.trace
for k in 1 2; do
  for b in tfwgpu-bench-old tfwgpu-bench; do
    echo "-- $b $k $(date +%T)"
    TFWGPU_TUNE_CACHE=/tmp/tune-lazy.json timeout 100 ./.hostrun/$b replay /tmp/cnn.trace --repeat 20 --top 12 > $L/$b-$k.txt 2>&1
    grep -E "^  Conv2D |^  _TfwgpuConv2DBiasAdd |^  MaxPool |host time of all|infer_step\" \(timed" $L/$b-$k.txt | head -8
    grep -A1 "steps \"infer_step\"" $L/$b-$k.txt | head -3
  done
done
echo "== done $(date +%T)"
tar czf $OUT/lazy21-r5-logs.tgz -C $OUT logs
