#!/usr/bin/env bash
# Session 21 (issue 6 / 7), ~1 min on one H200, no TensorFlow; carry .gl, .hostrun (bench at
# conv chooser v11 with the >= 52-tile rule).
# 1. v11: the auto pick on the four long-K 1x1 rows should now run at the forced 16-subgroup
#    tile's figures of occ21-r1 (forward busy 0.060 / 0.064 / 0.034 / 0.035 ms) and the K-512
#    input gradients (gemm_7, r50_7) at occ20-r7/r8's forced figures (0.057 / 0.032).
#    PREDICTION: within 3% of those; DECISION: a row more than 3% over its forced figure in
#    both processes sends v11 back to its measured rows only.
# 2. Which dispatches the replayed CNN inference step records on the H200 (call21-r2 failed:
#    the trace must be decompressed).
source bench/h200/lib.sh
for x in 1 2; do
  echo "-- conv v11 $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-v11-$x.json timeout 100 $B conv --dtype f16 --cases gemm_28_1x1_1152_128,gemm_7_1x1_4608_512,r50_28_1x1_512_128,r50_7_1x1_2048_512 --ops fwd,bwd_input --reps 3 --sample-ms 10 --json $L/v11-$x.json > $L/v11-$x.txt 2>&1
  grep -E "fwd|bwd|WRONG|error" $L/v11-$x.txt
done
echo "-- replay dispatches $(date +%T)"
zcat bench/traces/cnn.trace.gz > /tmp/cnn.trace
TFWGPU_LOG=tfwgpu_dispatch=trace timeout 60 $B replay /tmp/cnn.trace --repeat 1 > $L/replay-dispatch.txt 2>&1
grep -a "tfwgpu_dispatch" $L/replay-dispatch.txt | sed 's/.*tfwgpu_dispatch[^ ]* //' | tail -10
echo "== done $(date +%T)"
tar czf $OUT/v11-r3-logs.tgz -C $OUT logs
