#!/usr/bin/env bash
# redfuse request 1: ResNet-50 training step replays (batch 64; lavapipe batch-2 captures
# rewritten by bench/trace_rebatch.py). before = bench/traces/resnet50-b2to64-multi.trace.gz
# (main's grouping, session 6); after = this branch (reductions with an elementwise prologue:
# _TfwgpuFusedReduce / _TfwgpuFusedReduceMulti). after-noquad: the same trace with
# TFWGPU_REDUCE_QUAD=0 (offsets of each element of a vec4 load computed on their own).
# noexp = the branch's first capture (reductions without exports: batch norm's ReluGrad a
# kernel of its own). Rounds alternate; a round is skipped when the call has run 195 s.
set -u
rm -f /tmp/rf-*
export TFWGPU_TUNE_CACHE=/tmp/tune-redfuse.json
./tfwgpu-bench devices 2>&1 | head -3
for t in before after noexp; do gzip -dc $t.trace.gz > /tmp/rf-$t.trace; done
echo "== warm-up (tuning) $(date +%T)"; timeout 60 ./tfwgpu-bench replay /tmp/rf-before.trace --repeat 1 > /tmp/rf-warm.log 2>&1; echo "rc=$? $(date +%T)"; grep -E "^replay x|steps \"train_step\":" /tmp/rf-warm.log; tail -2 /tmp/rf-warm.log
r() {
  # r NAME TRACE ROUND [ENV=VALUE]
  if [ $SECONDS -gt 195 ]; then echo "== $1 round $3 skipped (${SECONDS} s)"; return; fi
  echo "== $1 (round $3) $(date +%T)"
  env ${4:-X_UNUSED=1} timeout 32 ./tfwgpu-bench replay /tmp/rf-$2.trace --repeat 6 --top 40 --json /tmp/rf-$1-$3.json > /tmp/rf-$1-$3.log 2>&1
  rc=$?
  grep -E "^trace|^replay x|dispatches by kernels|GPU \(timestamps|steps \"train_step\"|steps \"infer_step\"|idle \(medians\)|^  [A-Z_a-z]" /tmp/rf-$1-$3.log | head -70
  [ $rc = 0 ] || { echo "rc=$rc"; tail -5 /tmp/rf-$1-$3.log; }
}
r after after 1
r before before 1
r after-noquad after 1 TFWGPU_REDUCE_QUAD=0
r before before 2
r after after 2
r noexp noexp 1
echo "== end $(date +%T) (${SECONDS} s)"
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = {os.path.basename(p)[3:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/rf-*-[12].json"))}
json.dump(out, open(os.path.join(sys.argv[1], "replays.json"), "w"))
for k, v in out.items():
    s = v["steps"].get("train_step", {})
    print(k, "train median %.2f ms (min %.2f), timed: busy %.1f%% of %.2f ms" % (s.get("median_ms", 0), s.get("min_ms", 0), s.get("gpu_busy_pct_median", 0), s.get("timed_wall_median_ms", 0)), "dispatches", v.get("dispatches"), "kernels", v.get("kernels"))
PY
cat /tmp/rf-*-[12].log > "$OUT/logs.txt" 2>/dev/null
ls -la $OUT
