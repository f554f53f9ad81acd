#!/usr/bin/env bash
# mofuse request 2: request 1 again with the runtime's host path for fused kernels cheaper
# (key text precomputed, restricted programs cached), two rounds of each trace after a warm-up
# (conv tuning) so that no replay times out (old-real: in request 1). Traces as in request 1 (old-real = the H200
# capture in bench/traces; before64/after64 = lavapipe batch-2 captures, main's grouping and
# this branch's, rewritten to batch 64 by bench/trace_rebatch.py).
set -u
rm -f /tmp/mofuse-*
export TFWGPU_TUNE_CACHE=/tmp/tune-mofuse.json
./tfwgpu-bench devices 2>&1 | head -3
for t in before64 after64; do gzip -dc $t.trace.gz > /tmp/mofuse-$t.trace; done
echo "== warm-up (tuning) $(date +%T)"; timeout 75 ./tfwgpu-bench replay /tmp/mofuse-before64.trace --repeat 1 > /tmp/mofuse-warm.log 2>&1; echo "rc=$? $(date +%T)"; grep -E "^replay x|steps \"train_step\":" /tmp/mofuse-warm.log; tail -2 /tmp/mofuse-warm.log
r() {
  echo "== $1 (round $2) $(date +%T)"
  timeout 38 ./tfwgpu-bench replay /tmp/mofuse-$1.trace --repeat 6 --top 40 --json /tmp/mofuse-$1-$2.json > /tmp/mofuse-$1-$2.log 2>&1
  rc=$?
  grep -E "^trace|^replay x|dispatches by kernels|GPU \(timestamps|steps \"train_step\"|steps \"infer_step\"|idle \(medians\)|^  [A-Z_a-z]" /tmp/mofuse-$1-$2.log | head -90
  [ $rc = 0 ] || { echo "rc=$rc"; tail -5 /tmp/mofuse-$1-$2.log; }
}
r after64 1
r before64 1
r before64 2
r after64 2
echo "== end $(date +%T)"
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = {os.path.basename(p)[7:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/mofuse-*-[12].json"))}
json.dump(out, open(os.path.join(sys.argv[1], "replays.json"), "w"))
for k, v in out.items():
    s = v["steps"].get("train_step", {})
    print(k, "train median %.2f ms (min %.2f), timed: busy %.1f%% of %.2f ms" % (s.get("median_ms", 0), s.get("min_ms", 0), s.get("gpu_busy_pct_median", 0), s.get("timed_wall_median_ms", 0)), "dispatches", v["dispatches"], "kernels", v["kernels"])
PY
ls -la $OUT
