#!/usr/bin/env bash
# sub11 request 1 (issue 7; written in session 10, NOT YET RUN on a GPU): the uniform ring
# (TFWGPU_UNIFORM_RING=1, branch sub11) against the default (each submit's uniforms through
# Queue::write_buffer: a new staging buffer and the queue's pending-writes command buffer per
# submit, ~28 us of the ~110 us host time per submit on the H200, session 10 host10).
# Request folder as for host10's requests: .hostrun/libtfwgpu_plugin.so and .hostrun/tfwgpu-bench
# (release, stripped, branch sub11), bench/{keras_models,keras_floor,hostlog,torch_keraslike,
# torch_models,gpu_host}.py/sh, python/tensorflow_wgpu. Parts:
#  1. tfwgpu-bench overhead --batch-ops 8 (a batch submitted every 8 kernel calls), ring off/on
#     alternated twice, host-logged: the submit phases per submit (submit_uniforms, ring_begin,
#     submit_remap, submit_finish, submit_queue), bench/hostlog.py;
#  2. Keras CNN (batch 64) training step, off/on interleaved in three rounds (separate
#     processes), PyTorch like for like at the start of each round;
#  3. one host-logged budget run each (keras_models.py --host-budget 1).
# ~210 s; parts skipped past their time marks. How to build the request folder and the decision
# rule: bench/NOTES-submit.md ("What the next session should run").
set -u
T0=$(date +%s); left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export TFWGPU_TUNE_CACHE=/tmp/tune-sub11.json
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
B=.hostrun/tfwgpu-bench
echo "== 1. overhead --batch-ops 8, host-logged $(date +%T)"
for r in 1 2; do
  for v in 0 1; do
    left 60 || break
    TFWGPU_UNIFORM_RING=$v TFWGPU_HOST_LOG=/tmp/hl-ov-$v-$r.json timeout 20 $B overhead --batch-ops 8 --calls 4096 --reps 7 --json $L/overhead-$v-$r.json > $L/overhead-$v-$r.txt 2>&1
    echo -n "ring=$v r$r: "; grep -o "record [0-9.]* us/call wall" $L/overhead-$v-$r.txt
    python3 bench/hostlog.py /tmp/hl-ov-$v-$r.json --steps 3584 --json $L/hostlog-ov-$v-$r.json > $L/hostlog-ov-$v-$r.txt 2>&1
    grep -E "^(submit|ring|encoder)" $L/hostlog-ov-$v-$r.txt
    gzip -c /tmp/hl-ov-$v-$r.json > $L/hl-ov-$v-$r.json.gz; rm -f /tmp/hl-ov-$v-$r.json
  done
done
TK="timeout 25 python3 bench/torch_keraslike.py --models cnn --steps 200 --warmup 20 --reps 1 --variants pageable+sync,infer"
KM="timeout 25 python3 bench/keras_models.py --models cnn --steps 300 --warmup 10"
for r in 1 2 3; do
  left 170 || { echo "(time: skipped round $r)"; break; }
  echo "== 2. round $r $(date +%T)"
  $TK --json $L/torch-$r.json > $L/torch-$r.txt 2>&1; grep -E "ms/step" $L/torch-$r.txt || tail -3 $L/torch-$r.txt
  for v in 0 1; do
    bash bench/gpu_host.sh run "echo -n 'ring=$v r$r: '; env TFWGPU_UNIFORM_RING=$v $KM --json $L/keras-$v-$r.json 2>&1 | grep batch"
  done
done
for v in 1 0; do
  left 200 || { echo "(time: skipped host log ring=$v)"; continue; }
  echo "== 3. host log: ring=$v $(date +%T)"
  bash bench/gpu_host.sh run "env TFWGPU_UNIFORM_RING=$v TFWGPU_HOST_LOG=/tmp/hl-$v.json timeout 30 python3 bench/keras_models.py --models cnn --steps 200 --warmup 10 --host-budget 1 --json $L/budget-$v.json > $L/budget-$v.txt 2>&1; grep -E 'ms/step|h2d wall' $L/budget-$v.txt | grep -v infer"
  python3 bench/hostlog.py /tmp/hl-$v.json --json $L/hostlog-$v.json > $L/hostlog-$v.txt 2>&1
  gzip -c /tmp/hl-$v.json > $L/hl-$v.json.gz; rm -f /tmp/hl-$v.json
  grep -E "^(submit|ring|encoder|htod|sync)" $L/hostlog-$v.txt | head -14
done
echo "== summary $(date +%T) ($(( $(date +%s) - T0 )) s)"
grep -h "ms/step" $L/torch-*.txt 2>/dev/null
for v in 0 1; do for r in 1 2; do echo -n "overhead ring=$v r$r: "; grep -E "^submit " $L/hostlog-ov-$v-$r.txt; done; done
