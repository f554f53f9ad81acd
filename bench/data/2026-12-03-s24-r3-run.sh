# Session 24, request s24-r3 (issue 7): Keras LSTM(64) / GRU(64) training through the fused
# recurrent op and through Keras's loop (use_cudnn=False), and PyTorch's cuDNN layers and
# per-timestep cell loops, all in ONE process, blocks alternating (new bench/seq_interleaved.py,
# 40 steps per block, 8 rounds): s24-r1 / r2 compared settings across processes, whose speed
# differed by up to 2x. This session's final plugin (the fused steps opt-in, MatMul steps by
# default) and package (`_whole_params`). TensorFlow staged first.
#
# Prediction (written before the run): loop / fused 3-5x for both layers; Keras fused / PyTorch
# cuDNN 1.2-2.0x (LSTM 61 and GRU 59 TensorFlow kernel calls per step against PyTorch's ~15
# launches plus its optimizer); Keras loop / PyTorch cell loop 1.7-2.5x (s23: 1.7-2.5x across
# calls). Rules: figures to RESULTS as measured.
source bench/h200/lib.sh
bash bench/gpu_host.sh run "python3 bench/seq_interleaved.py --models lstm,gru --steps 40 --rounds 8 --json $L/seq.json > $L/seq.log 2>&1"
cat "$L/seq.log" | grep -v -i "warning\|I0000\|W0000"
tar czf "$OUT/s24-r3.tgz" -C "$OUT" logs
