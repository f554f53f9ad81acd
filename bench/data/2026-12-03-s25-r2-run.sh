# Session 25, request s25-r2: a volumetric CNN's training step (bench/vol_interleaved.py: three
# Conv3D layers, two MaxPooling3D, on 32^3 volumes, batch 16, float32) in Keras on tfwgpu (the
# new Conv3D as sums of Conv2Ds over depth taps, the new 3-D pooling kernels; before this
# session both ran on the CPU) and PyTorch's cuDNN Conv3d (TF32 off), one process, blocks
# alternating (20 steps per block, 6 rounds). TensorFlow staged first.
#
# Prediction (written before the run): PyTorch 1.5-3 ms per step (~10 GFLOP per step, launch-
# and host-bound); Keras 4-10 ms (each Conv3D is KD Conv2Ds plus an output-sized sum pass per
# direction, the pooling a plain gather); ratio 2-5x. Figures to RESULTS as measured.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "python3 bench/vol_interleaved.py --steps 20 --rounds 6 --json $L/vol.json > $L/vol.log 2>&1"
cat "$L/vol.log" | grep -v -i "warning\|I0000\|W0000\|self.data_adapter"
tar czf "$OUT/s25-r2.tgz" -C "$OUT" logs
