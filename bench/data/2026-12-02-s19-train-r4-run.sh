#!/usr/bin/env bash
# Session 19, request 4 (issue 7), after request 3 (2026-12-02-s19-train-r3-*): there, the
# interleaved Keras CNN training step was 1.30x / 1.19x PyTorch's like-for-like step in the
# same process, but PyTorch's step in that process (2.05-2.19 ms like for like, 1.96-2.05 with
# the batch on the GPU) was slower than in its own processes in session 18 (1.56-1.82 ms).
# Does TensorFlow in the process (its inter-op pool spinning after each Keras block, its
# allocator, OpenMP) slow PyTorch's step? Alternates, in one warm machine: A = PyTorch alone
# (bench/torch_keraslike.py --variants pageable+sync,device, 200 steps x 5), B = request 3's
# interleaved run (12 rounds of 200 steps), A, B.
# PREDICTION: PyTorch's step in B within 10% of A's adjacent runs (the host is the same). If it
# is slower by more than 10% in both B runs, TensorFlow's presence is a confound: the goal is
# then judged on Keras (B) against PyTorch alone (A, adjacent), as well as on B's ratio, and
# met only if both are <= 1.5x.
set -u
L=$OUT/logs; mkdir -p $L
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
export TFWGPU_TUNE_CACHE=/tmp/tune-s19.json
for k in 1 2; do
  echo "-- A $k $(date +%T)"
  timeout 90 python3 bench/torch_keraslike.py --models cnn --variants pageable+sync,device --steps 200 --reps 5 --json $L/A-$k.json 2>&1 | grep -E "train|Error"
  bash bench/gpu_host.sh run "echo '-- B $k'; timeout 150 python3 bench/infer_interleaved.py --train --model cnn --calls 200 --rounds 12 --json $L/B-$k.json 2>&1 | grep -E '^medians|^keras/|Error|error' | head -8"
done
tar czf $OUT/s19-train-r4-logs.tgz -C $OUT logs && rm -rf $L
