#!/usr/bin/env bash
# Prepared in session 18 (issue 6), not run yet: ~4-5 min on one H200, no TensorFlow.
# Carries .gl, .hostrun/tfwgpu-bench and .hostrun/coop-persist-test (release, stripped, gzipped;
# the test binary from `cargo test --release -p tfwgpu-runtime --test coop_persist --no-run`,
# the path it prints). The persistent tiles' checks on the device run first: if they fail, the
# persistent rows below are measurements of a wrong kernel, not results.
# Why: NOTES-coop.md (session 18) shows the float16 1x1 rows are the ones with the most room to
# 4x our float32 (floors of 10-21 us against targets of 12-34 us; ours 24-68 us, 0.95-1.5 TB/s
# of their own bytes), and that their 128 x 128 tiles (K 64-256) run each tile's loads,
# products and stores in sequence on 2-3 workgroups per SM. This sweeps the cooperative tiles
# on them, with the new 64 x 128 one (c64x128x64_2x4wg1f: twice the tiles, fewer registers per
# workgroup) and the K-32 two-buffer tiles (c128x128x32_2x4wg / wg2: with K 64 the second K
# tile's loads overlap the first one's products), against `auto` (the chooser), in two
# processes, and our float32 for the ratio; then stream-K (`TFWGPU_CONV_COOP_STREAMK=1`: one
# wave of workgroups, each walking its run of tiles: persistence without the next tile's loads
# issued early), never measured on these rows. And the persistent tiles (`...wg1fp`, session
# 18, CoopTile::persist: a workgroup keeps its N tile and walks M tiles, the last K tile's loads
# fetching the next M tile's first one, stored after the epilogue; lavapipe-tested only) at the
# default wave (264 workgroups) and at 528 (TFWGPU_COOP_PERSIST_WAVE); the conv plans give
# persistent tiles no K split and no head/tail launch.
# PREDICTION (before the run): no tile is more than 15% faster than auto on the 128+-column
# rows; c64x128 within +-15% of auto there; the persistent 128 x 128 tile 10-30% faster than
# c128x128x64_2x4wg1f where K is one tile (r50_56_1x1_64_256 forward 67.8 -> 47-61 us), 0-10%
# where K is four (r50_56_1x1_256_64). DECISION: a tile becomes the chooser's pick for
# plain 1x1 products of its row's class (N >= 128, K <= 256, stride 1) if it beats auto by >= 5%
# in both processes on r50_56_1x1_64_256 and r50_56_1x1_256_64 (fwd and bwd_input); a row
# class that reaches 4x our float32 is recorded in bench/RESULTS.md.
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-coop1x1.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
if [ -x .hostrun/coop-persist-test ]; then
  echo "-- persistent tiles on the device $(date +%T)"
  timeout 120 .hostrun/coop-persist-test --nocapture > $L/persist-test.txt 2>&1; echo "rc=$?" >> $L/persist-test.txt
  grep -E "^test |test result|panicked|skipped|rc=" $L/persist-test.txt
else
  echo "!! no .hostrun/coop-persist-test: the persistent tiles are not checked on the device"
fi
CASES=r50_56_1x1_64_64,r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_256_128_s2
TILES=auto,c64x64x64_2x2w1fs,c128x64x64_4x2wg1f,c128x128x64_2x4wg1f,c64x128x64_2x4wg1f,c128x128x64_4x4wg1fse8,c128x128x32_2x4wg,c128x128x32_2x4wg2,c128x128x64_2x4wg1fp,c64x128x64_2x4wg1fp
for k in 1 2; do
  echo "-- f16 sweep $k $(date +%T)"
  timeout 200 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles $TILES --reps 3 --sample-ms 10 --json $L/f16-$k.json > $L/f16-$k.txt 2>&1
  tail -40 $L/f16-$k.txt
  echo "-- f16 stream-K $k $(date +%T)"
  TFWGPU_CONV_COOP_STREAMK=1 timeout 120 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles auto,c64x128x64_2x4wg1f --reps 3 --sample-ms 10 --json $L/f16sk-$k.json > $L/f16sk-$k.txt 2>&1
  tail -18 $L/f16sk-$k.txt
  echo "-- f16 persistent, wave 528 $k $(date +%T)"
  TFWGPU_COOP_PERSIST_WAVE=528 timeout 120 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input --tiles c128x128x64_2x4wg1fp,c64x128x64_2x4wg1fp --reps 3 --sample-ms 10 --json $L/f16p528-$k.json > $L/f16p528-$k.txt 2>&1
  tail -18 $L/f16p528-$k.txt
  echo "-- f32 $k $(date +%T)"
  timeout 120 $B conv --dtype f32 --cases $CASES --ops fwd,bwd_input --reps 3 --sample-ms 10 --json $L/f32-$k.json > $L/f32-$k.txt 2>&1
  tail -12 $L/f32-$k.txt
done
tar czf $OUT/coop1x1-sweep-logs.tgz -C $OUT logs && rm -rf $L
