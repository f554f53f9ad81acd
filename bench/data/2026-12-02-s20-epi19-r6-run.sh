#!/usr/bin/env bash
# Prepared in session 19 (issue 6), NOT run yet: ~3 min on one H200, no TensorFlow.
# Build main at c195710 or later with bench/patches/epi19-measure.patch applied (the
# measurement forms of branch epi19, not on main; `git apply bench/patches/epi19-measure.patch`
# in the checkout, build, then `git checkout -- crates`):
#   cargo build --release -p tfwgpu-bench
#   strip -o .hostrun/tfwgpu-bench target/release/tfwgpu-bench
#   strip -o .hostrun/tfwgpu-shader-stats target/release/tfwgpu-shader-stats; gzip -f .hostrun/*
# and carry .gl and .hostrun. Why (NOTES-coop.md, session 19): on r50_56_1x1_64_256 forward the K
# sweep left a fixed per-tile part of 44-52 us of 58-68 (the products 14-17 us per K tile), and
# the 128 x 128 8-subgroup tile ran one workgroup per SM in v3/v4 (183-194 registers): its
# first loads and its epilogue (8 accumulators through the scratch) are exposed on every tile.
# 1. The driver's register counts for the tiles of these rows (is the 64 x 128 tile, which was
#    20-36% slower, at two workgroups per SM or not? the persistent twin's count?).
# 2. epi1: every accumulator folded into acc_0_0 (cooperative-matrix adds), one accumulator's
#    epilogue: the epilogue's share of the fixed part, the products kept (results wrong by
#    design: the bench prints WRONG).
# 3. The late-staging tiles c128x128x64_2x4wg1l and c128x64x64_4x2wg1l (main, session 19: the next K tile loaded after
#    the products, so no staged value lives across them; lavapipe-tested only): its registers,
#    and its time on the rows (its rel err must be within the float16 bound in the base runs).
# PREDICTION: 128 x 128 tiles 180-200 registers (one workgroup per SM), 64 x 128 ~120-130
# (two), the late tile 20-40 fewer than c128x128x64_2x4wg1f; epi1 cuts r50_56_1x1_64_256
# forward (K 64) by 15-25 us and k_56_1x1_512_256 (K 512) by about as much (the epilogue is per
# tile, not per K tile); the late tile within +-10% of wg1f at K 64 if it stays at one
# workgroup per SM, 20-35% faster if it reaches two, slower at K 512 (no overlap of loads).
# DECISION (for the next kernel change): if epi1 takes >= 15 us off the K-64 row, the target
# is the epilogue (fewer accumulators per subgroup: 16 subgroups with a scratch per subgroup,
# staging trimmed to fit 48 KiB for K <= 128); if < 8 us, the first loads and occupancy
# (registers to reach two workgroups per SM). The late tile becomes the conv chooser's pick
# for plain products with K <= 64 if its results are exact and it is >= 5% under the pick
# (busy) on r50_56_1x1_64_256 fwd and r50_56_1x1_256_64 bwd_input in both base runs; the late
# 128 x 64 tile likewise on r50_56_1x1_256_64 fwd and r50_56_1x1_64_256 bwd_input (the
# chooser's 128 x 64 rows).
source bench/h200/lib.sh
export TFWGPU_TUNE_CACHE=/tmp/tune-epi19.json
timeout 150 ./.hostrun/tfwgpu-shader-stats --filter c128x128x64_2x4wg1f,c128x128x64_2x4wg1l,c64x128x64_2x4wg1f,c128x64x64_4x2wg1f,c128x64x64_4x2wg1l,c64x64x64_2x2w1fs > $L/stats.txt 2>&1
grep -iE "coop_|register|spill" $L/stats.txt | head -60
CASES=r50_56_1x1_64_256,k_56_1x1_128_256,k_56_1x1_512_256,r50_56_1x1_256_64
for x in base epi1 base epi1; do
  echo "-- $x $(date +%T)"
  TFWGPU_COOP_EPI=$x timeout 100 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles c128x128x64_2x4wg1f,c128x128x64_2x4wg1fp,c128x128x64_2x4wg1l,c128x64x64_4x2wg1f,c128x64x64_4x2wg1l --reps 3 --sample-ms 10 --json $L/$x-$(date +%s).json > $L/$x-$(date +%s).txt 2>&1
done
tar czf $OUT/epi19-r6-logs.tgz -C $OUT logs && rm -rf $L
