#!/usr/bin/env bash
# Session 20 (issue 6), ~3 min on one H200, no TensorFlow. Build main at the v10 commit (cargo build
# --release -p tfwgpu-bench; strip, gzip into .hostrun); carry .gl, .hostrun.
# Why: v10 (request occ20-r3's rule) moved plain products with N > 128 and K <= 128 to
# `c64x128x32_2x4wg1fp` on the evidence of two K-64 rows; it also moves two K-128 input
# gradients (r50_28_1x1_512_128, gemm_28_1x1_1152_128) not measured with it. And requests 3 and 5
# saw the stride-2 1x1 rows 8-11% faster on the K-32 tiles, outside any written rule.
# PREDICTION: on the two K-128 input gradients v10's pick within +-5% of v9's
# (`c128x128x64_2x4wg1fp`; session 19: 39.7 and 82.7 us busy); the stride-2 forward on
# `c64x64x32_2x2w1f` and its input gradient (phases) on `c64x128x32_2x4wg1f` 8-12% under the
# chooser again.
# DECISION: (A) if v10's pick is more than 2% over `c128x128x64_2x4wg1fp` (busy) on either K-128
# input gradient in either process, v10's 64 x 128 choice is cut back to K <= 64; else it stays.
# (B) windowed products (not plain) with N <= 128 and K <= 256 take `c64x64x32_2x2w1f` if it is
# >= 5% under the chooser on r50_56_1x1_256_128_s2 fwd in both processes (exact); windowed ones
# with N > 128 and K <= 128 (the stride-2 1x1 input gradient's phases) take `c64x128x32_2x4wg1f`
# if it is >= 5% under on r50_56_1x1_256_128_s2 bwd_input in both processes.
source bench/h200/lib.sh
CASES=r50_28_1x1_512_128,gemm_28_1x1_1152_128,r50_14_1x1_1024_256,r50_56_1x1_256_128_s2
TILES=auto,c128x128x64_2x4wg1fp,c128x128x64_2x4wg1f,c128x64x64_4x2wg1f,c64x128x32_2x4wg1fp,c64x128x32_2x4wg1f,c64x64x32_2x2w1f,c128x64x32_4x2wg1fp
for x in 1 2; do
  echo "-- conv $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-r6-$x.json timeout 200 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles $TILES --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1
  grep -E "WRONG|error" $L/conv$x.txt | head -5
done
tar czf $OUT/occ20-r6-logs.tgz -C $OUT logs && rm -rf $L
