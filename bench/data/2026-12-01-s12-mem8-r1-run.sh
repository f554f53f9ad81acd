#!/usr/bin/env bash
# mem8 request 1 (~110 s; every step under `timeout`). One binary (branch mem8, commit ccf7cbd):
# TFWGPU_NORM_GRID=1 runs every training batch norm (forward and gradient) in ONE dispatch
# (grid.wgsl: statistics, last-arrival merge per channel tile, every workgroup waits for its
# tile's coefficients and applies them to its own chunk, re-read from L2), the grid sized by a
# residency probe of that pipeline; default = main's kernels (onepass.wgsl on four rows,
# stats_last.wgsl + apply on the rest).
# - grid_info: the grid on all rows with TFWGPU_LOG=info (the probe's line: how many
#   workgroups are resident at once; the bench's own error check on every row);
# - A/B interleaved twice: TFWGPU_NORM_GRID=1 against the default, the 15 batch-norm rows of
#   the issue's table, one large copy in each step;
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
  step grid_info 30 "$BNA" TFWGPU_NORM_GRID=1 TFWGPU_LOG=info
  step def1 25 "$BNA"
  step grid1 25 "$BNA" TFWGPU_NORM_GRID=1
  step def2 25 "$BNA"
  step grid2 25 "$BNA" TFWGPU_NORM_GRID=1
  echo "== torch_ref.py"; SECONDS=0
  timeout 25 python3 torch_ref.py --cases "$BNA" --reps 10 --json $T/torch.json; echo "rc=$? (${SECONDS}s)"
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
