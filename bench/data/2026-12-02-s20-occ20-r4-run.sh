#!/usr/bin/env bash
# Session 20 (issue 6), ~5 min on one H200, no TensorFlow: the conv chooser's v10 checked. Build main
# (this commit or later): cargo build --release -p tfwgpu-bench; cargo test --release --no-run -p
# tfwgpu-runtime --test coop_persist (-> .hostrun/coop_persist); strip, gzip; carry .gl, .hostrun.
# 1. coop_persist on the H200: the persistent tiles (now with c128x64x32_4x2wg1fp and
#    c64x128x32_2x4wg1fp, v10's picks) walking several M tiles, K of one to five tiles, Conv2D.
# 2. issue 6's float16 Conv2D table (session 10's nine cases, 27 rows), float16 (auto) and our
#    float32 in alternating processes (N1 B1 N2 B2), for the rows at >= 4x.
# PREDICTION: coop_persist passes. v10 moves only the six plain 1x1 rows (fwd and bwd_input of
# r50_56_1x1_64_64, _64_256, _256_64): 64_64 ~20 us wall (2.3-2.5x our float32), 64_256 fwd ~52
# (2.4x), bwd_input ~40 (3.0x), 256_64 fwd ~40 (3.0x), bwd_input ~55 (2.3x); no new row at 4x
# (the count stays 6 of 27; float32 and float16 move between processes by up to 10-20%).
source bench/h200/lib.sh
timeout 150 ./.hostrun/coop_persist --test-threads 1 > $L/coop_persist.txt 2>&1; tail -3 $L/coop_persist.txt
CASES=wide,r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2,r50_56_3x3_128_128_s2,r50_28_3x3_128_128,r50_14_3x3_256_256,r50_7_3x3_512_512
for x in 1 2; do
  echo "-- f16 $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-n$x.json timeout 150 $B conv --dtype f16 --cases $CASES --reps 3 --sample-ms 10 --json $L/n$x-f16.json > $L/n$x-f16.txt 2>&1
  grep -E "WRONG|error" $L/n$x-f16.txt | head -5
  echo "-- f32 $x $(date +%T)"
  TFWGPU_TUNE_CACHE=/tmp/tune-b$x.json timeout 150 $B conv --dtype f32 --cases $CASES --reps 3 --sample-ms 10 --json $L/b$x-f32.json > $L/b$x-f32.txt 2>&1
  grep -E "WRONG|error" $L/b$x-f32.txt | head -5
done
tar czf $OUT/occ20-r4-logs.tgz -C $OUT logs && rm -rf $L
