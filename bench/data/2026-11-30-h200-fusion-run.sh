#!/usr/bin/env bash
# fusion: replay the small models' traces before (captured with TFWGPU_FUSION=0) and after
# elementwise fusion (captured on lavapipe with the fusion branch), 5 repeats each.
set -u
LOG=$OUT/fusion-replay-log.txt
T=$(mktemp -d)
timeout 30 ./tfwgpu-bench devices > "$LOG" 2>&1
for m in mlp cnn resnet; do
  for v in before after; do
    gunzip -c traces/$v/$m.trace.gz > "$T/$m-$v.trace"
    echo "=== $m $v" >> "$LOG"
    timeout 30 ./tfwgpu-bench replay "$T/$m-$v.trace" --repeat 5 --top 12 --json "$T/$m-$v.json" >> "$LOG" 2>&1
    echo "rc=$?" >> "$LOG"
  done
done
python3 - "$T" "$OUT/fusion-replays.json" <<'PY'
import glob, json, os, sys
out = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    with open(p) as f:
        out[os.path.basename(p)[:-5]] = json.load(f)
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
PY
