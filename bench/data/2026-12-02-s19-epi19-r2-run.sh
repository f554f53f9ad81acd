#!/usr/bin/env bash
# Session 19 (issue 6), branch epi19, request 2. Request 1 (epi19-r1.sh) found the epilogue's
# barriers cheap (dropping both: 1-4%) and its global stores plus 7 of 8 scratch reads worth
# 20% on the N-256 K-64 rows (nostore: 57.9 -> 46.6 us). The vector epilogue reads 8
# consecutive floats of a row-major 16 x 16 scratch per lane: lane l at 8l + q, so if those
# are scalar loads, lanes l and l + 4 hit one bank (8-way conflicts, 64 wavefronts per
# accumulator instead of 8). cmS: the accumulator stored column-major (coopStore) with a
# stride of S floats, lane l reading row l % 16, columns 8 (l / 16) + q at (col + q) * S + row:
# S = 20 (80-byte columns, 16-byte aligned): reads 2-way, the store's 4-byte writes
# conflict-free; S = 18 (72 bytes): reads conflict-free, stores 2-way. Forms, one process each:
# base, cm20, cm18, base, cm20 (busy agreed within 1% between processes in request 1).
# PREDICTION: if the reads were scalar and 8-way, cm20 and cm18 cut the K-64 N-256 rows
# 58 -> 48-52 us (most of nostore's 11 us); if the compiler already vectorized them (LDS.128,
# 2-way), +-3%. DECISION: a form becomes the default vector epilogue if its results are exact
# (rel err within the float16 bound on every row) and it cuts GPU busy >= 5% on both K-64
# N-256 rows in both of its processes (cm20) / its process (cm18, then confirm next call),
# with no row of the set slower by > 3%.
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
export TFWGPU_TUNE_CACHE=/tmp/tune-epi19.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
CASES=r50_56_1x1_64_256,r50_56_1x1_256_64,r50_56_1x1_64_64,r50_28_1x1_512_128,r50_14_3x3_256_256,r50_28_3x3_128_128
n=0
for x in base cm20 cm18 base cm20; do
  n=$((n+1)); echo "-- $x $(date +%T)"
  TFWGPU_COOP_EPI=$x timeout 120 $B conv --dtype f16 --cases $CASES --ops fwd,bwd_input,bwd_filter --tiles auto,c128x128x64_2x4wg1f --reps 3 --sample-ms 10 --json $L/$n-$x.json > $L/$n-$x.txt 2>&1
  grep -E "WRONG|error" $L/$n-$x.txt | head -5; tail -3 $L/$n-$x.txt
done
for x in base cm20; do
  n=$((n+1)); echo "-- matmul $x $(date +%T)"
  TFWGPU_COOP_EPI=$x timeout 60 $B matmul --dtype f16 --sizes 1024,4096 --reps 5 --json $L/$n-mm-$x.json > $L/$n-mm-$x.txt 2>&1
  tail -3 $L/$n-mm-$x.txt
done
tar czf $OUT/epi19-r2-logs.tgz -C $OUT logs && rm -rf $L
