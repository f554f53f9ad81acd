#!/usr/bin/env bash
# Session 20 (issue 6), ~4 min on one H200, no TensorFlow. Build main at the v10 commit or later
# (cargo build --release -p tfwgpu-bench; strip, gzip into .hostrun); carry .gl, .hostrun.
# Why (bench/RESULTS.md, session 20): the driver gives a workgroup of >= 28 KiB an SM to itself;
# the 3x3 rows run on `c128x128x64_4x4wg1fse8` (44 KiB: one workgroup of 16 warps per SM, every
# barrier stalls the SM); the K-32 tiles of 22-23 KiB run two workgroups of 8 warps per SM (one's
# barrier overlaps the other's work) and won 11-21% on the 1x1 rows. Here they run the 3x3 rows
# and the stride-2 rows, all three ops, forced with --tiles, against the chooser, two processes.
# PREDICTION: within +-15% of the pick on the 3x3 rows: faster (5-15%) where the product has
# two or more waves of 128 x 64 tiles and K long enough to amortize the barrier pairs (wide,
# r50_28, r50_56_3x3_s2 forward and input gradient), slower on r50_14 / r50_7 (98 and 25-52
# tiles of 128 x 128, K 2304-4608: twice the barrier pairs per K); the filter gradients slower
# (their split plans were sized for 128 x 128).
# DECISION: a tile becomes the pick for the windowed 3x3 class (n >= 128, K >= 512: now
# `4x4wg1fse8`) on the rows where it is exact and >= 5% under the pick (busy) in both processes
# on all four named rows: wide fwd, r50_28 fwd, r50_28 bwd_input, r50_56_3x3_128_128_s2 fwd; the
# filter gradients and r50_14 / r50_7 by their own rows only if the same holds there.
source bench/h200/lib.sh
CASES=wide,r50_28_3x3_128_128,r50_56_3x3_128_128_s2,r50_14_3x3_256_256,r50_7_3x3_512_512,r50_56_1x1_256_128_s2
TILES=auto,c128x64x32_4x2wg1f,c64x128x32_2x4wg1f,c64x64x32_2x2w1f
for x in 1 2; do
  echo "-- conv $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-r5-$x.json timeout 260 $B conv --dtype f16 --cases $CASES --tiles $TILES --reps 3 --sample-ms 10 --json $L/conv$x.json > $L/conv$x.txt 2>&1
  grep -E "WRONG|error" $L/conv$x.txt | head -5
done
tar czf $OUT/occ20-r5-logs.tgz -C $OUT logs && rm -rf $L
