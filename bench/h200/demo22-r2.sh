# Session 22, request demo22-r2 (issue 7; the README's headline figures): the demo's own table
# with this session's final plugin and demo.py, which now times a second `evaluate` after a
# first that pays the evaluation shapes' first-use costs (demo22-r1 timed the first one:
# 0.48x TensorFlow's CPU for inference). TensorFlow staged first; the Fashion-MNIST IDX files
# staged into /tmp/data. Two runs of the demo (each GPU then CPU, 15 epochs).
#
# Prediction (written before the run): training as in demo22-r1 (GPU 28k-32k images/s, CPU
# 15k-17k, ratio 1.7-2.1x); inference on the GPU 50k-150k images/s (forward passes of 512
# images, ~2 ms each, host-bound), TensorFlow's CPU 33k-40k: ratio 1.3-4x; test accuracy
# 0.90-0.92 on both. Rule: the README's demo row takes the median of the two runs' figures.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "
for r in 1 2; do python3 -m tensorflow_wgpu.demo --data-dir /tmp/data --compare-cpu > $L/demo-\$r.log 2>&1; done
"
for r in 1 2; do echo "== demo $r"; grep -v 'ETA\|step - \|^Epoch\|absl\|oneDNN' "$L/demo-$r.log" | tail -7; done
tar czf "$OUT/demo22-r2.tgz" -C "$OUT" logs
