# Session 22, request demo22-r4 (issue 7): this session's final plugin and package (1729a9a:
# the review's fixes and SelectV2 of int32 on the host, neither run on the H200 before) on the
# Keras programs of bench/keras_fit_reads.py, one process, and a baseline for the next item:
# MultiHeadAttention, whose Einsum has no kernel and runs on the CPU. TensorFlow staged first.
#
# Prediction (written before the run): reads per step cnn 2, resnet 2, embed 2 (demo22-r2: 3;
# the id remap now on the host), mha 8.5 as on lavapipe (the Einsum products and their gradients
# on the CPU); ms per step cnn 3.0-3.4, resnet 3.8-4.2, embed 2.3-2.9 (demo22-r2 2.7-2.9), mha
# 4-10. Rule: the figures go to RESULTS as measured; a failure of a model that ran in demo22-r2
# is a regression of this session's last commits to fix before stopping.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "
python3 bench/keras_fit_reads.py --models cnn,resnet,embed,mha --steps 40 --json $L/final.json > $L/final.log 2>&1
"
grep -E '^(cnn|resnet|embed|mha) ' "$L/final.log" | cut -c1-300
tar czf "$OUT/demo22-r4.tgz" -C "$OUT" logs
