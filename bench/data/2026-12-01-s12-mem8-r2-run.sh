#!/usr/bin/env bash
# mem8 request 2 (~140 s; every step under `timeout`). One binary (branch mem8, commit f5a4dc0):
# TFWGPU_NORM_GRID=1 runs every training batch norm (forward and gradient) in ONE grid-wide
# dispatch (grid.wgsl); request 1 had it lose on 14 of 15 rows (fixed ~10-17 us more on small
# rows). Suspects: polls of the ready counter by every invocation (~135k, on the arrival
# counters' line), and the apply's loads in flight (4 workgroups of 256 per SM, two rows per
# iteration). Since then: ready counters on lines of their own; TFWGPU_NORM_GRID_POLL=one (one
# poller per workgroup); TFWGPU_NORM_GRID_ROWS4=1 (apply four rows per iteration).
# - A/B/C interleaved twice: default (main's kernels); grid with one poller (the first with
#   TFWGPU_LOG=info: the residency line); grid with one poller and the four-row apply; the 15
#   batch-norm rows of the issue's table, one large copy in each step;
# - PyTorch on the same rows (torch_ref.py).
# Files under $OUT: log.txt, results.json, smi.csv.
set -u
cd "$(dirname "$0")"
source .gl/activate.sh 2>/dev/null || true
B=./.hostrun/tfwgpu-bench
T=/tmp/mem8; rm -rf $T; mkdir -p $T
BNA="${BNA:-bn_train_64x56x56x256_f16,bn_grad_64x56x56x256_f16,bn_train_64x14x14x1024_f16,bn_grad_64x14x14x1024_f16,bn_grad_64x7x7x2048_f16,bn_train_64x7x7x2048_f16,bn_train_64x14x14x1024,bn_grad_64x14x14x1024,bn_train_64x56x56x256,bn_grad_64x56x56x256,bn_train_64x28x28x512,bn_grad_64x28x28x512,bn_train_32x14x14x256,bn_train_64x7x7x2048,bn_grad_64x7x7x2048}"
export TFWGPU_LOG=warn
export TFWGPU_TUNE_CACHE=/tmp/tune-mem8.json
timeout 175 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 250 > "$OUT/smi.csv" 2>&1 &
SMI=$!
step() { # name timeout-s cases [VAR=value ...]
  local name=$1 to=$2 cases=$3; shift 3
  echo "== $name: $* ($cases)"; SECONDS=0
  env "$@" timeout "$to" $B ops ${SMALL:-} --one-copy --no-same-copy --cases "$cases" --reps 5 --warm-ms 200 --json $T/$name.json
  echo "rc=$? (${SECONDS}s)"
}
{
  date -u; timeout 5 $B devices 2>&1 | head -3
  step def1 25 "$BNA"
  step one1 30 "$BNA" TFWGPU_NORM_GRID=1 TFWGPU_NORM_GRID_POLL=one TFWGPU_LOG=info
  step r4_1 25 "$BNA" TFWGPU_NORM_GRID=1 TFWGPU_NORM_GRID_POLL=one TFWGPU_NORM_GRID_ROWS4=1
  step def2 25 "$BNA"
  step one2 25 "$BNA" TFWGPU_NORM_GRID=1 TFWGPU_NORM_GRID_POLL=one
  step r4_2 25 "$BNA" TFWGPU_NORM_GRID=1 TFWGPU_NORM_GRID_POLL=one TFWGPU_NORM_GRID_ROWS4=1
  echo "== torch_ref.py"; SECONDS=0
  timeout 20 python3 torch_ref.py --cases "$BNA" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
  timeout 5 python3 - "$T" "$OUT/results.json" <<'PY'
import glob, json, os, sys
t, out = sys.argv[1], sys.argv[2]
doc = {}
for p in sorted(glob.glob(os.path.join(t, "*.json"))):
    with open(p) as f:
        doc[os.path.basename(p)[:-5]] = json.load(f)
with open(out, "w") as f:
    json.dump(doc, f)
PY
  date -u
} > "$OUT/log.txt" 2>&1
kill $SMI 2>/dev/null
grep -E "^== |resident|^bn_|^copy|gpu per run|^rc=|rror" "$OUT/log.txt" | tail -120
