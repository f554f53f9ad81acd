#!/usr/bin/env bash
# mofuse request 1: the ResNet-50 training step's replay before/after multi-output fusion.
# Traces (batch 64): old-real = bench/traces/resnet50.trace.gz (captured on the H200 with main);
# before64 / after64 = lavapipe captures at batch 2 (main's grouping: TFWGPU_FUSION_MULTI=0;
# this branch) rewritten to batch 64 by bench/trace_rebatch.py (before64's kernel calls equal
# old-real's step by step; addresses laid out anew). old-real vs before64 = the cost of the
# rewrite's memory layout; before64 vs after64 = the change.
set -u
export TFWGPU_TUNE_CACHE=/tmp/tune-mofuse.json
./tfwgpu-bench devices 2>&1 | head -4
for t in old-real before64 after64; do gzip -dc $t.trace.gz > /tmp/mofuse-$t.trace; done
r() {
  echo "== $1 (round $2)"
  timeout 50 ./tfwgpu-bench replay /tmp/mofuse-$1.trace --repeat 6 --top 40 --json /tmp/mofuse-$1-$2.json 2>&1 \
    | grep -E "^trace|^replay x|dispatches by kernels|GPU \(timestamps|steps \"train_step\"|steps \"infer_step\"|idle \(medians\)|kernel calls dispatched|^  [A-Z_a-z]" | head -90
}
r before64 1
r after64 1
r old-real 1
r after64 2
r before64 2
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = {os.path.basename(p)[7:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/mofuse-*-[12].json"))}
json.dump(out, open(os.path.join(sys.argv[1], "replays.json"), "w"))
for k, v in out.items():
    s = v["steps"].get("train_step", {})
    print(k, "train median %.2f ms (min %.2f), timed: busy %.1f%% of %.2f ms" % (s.get("median_ms", 0), s.get("min_ms", 0), s.get("gpu_busy_pct_median", 0), s.get("timed_wall_median_ms", 0)), "dispatches", v["dispatches"], "kernels", v["kernels"])
PY
ls -la $OUT
