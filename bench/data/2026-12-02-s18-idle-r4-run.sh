#!/usr/bin/env bash
# Session 18, request 4 (issue 7): the idle-age default (off since request 2) on Keras ResNet-50,
# which request 2's rule judged only through its replay. bench/idle_ab.py --model resnet50:
# blocks of 12 fit steps and 12 inference calls, age:50 against off, alternating in one process.
# PREDICTION: within +-2% (the step is GPU-bound: 66-71 ms of GPU work; the rule moves a few
# submits of the batch's tail). If off is slower by > 2% in the medians, say so in RESULTS and
# reconsider the default.
set -u
L=$OUT/logs; mkdir -p $L
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null; chmod +x .hostrun/*
export TFWGPU_TUNE_CACHE=/tmp/tune-s18.json
bash bench/gpu_host.sh run "timeout 400 python3 bench/idle_ab.py --model resnet50 --variants age:50,off --rounds 8 --train 12 --infer 12 --mirrored 0 --json $L/ab-r50.json 2>&1 | grep -E 'round|medians'"
tar czf $OUT/s18-idle-r4-logs.tgz -C $OUT logs && rm -rf $L
