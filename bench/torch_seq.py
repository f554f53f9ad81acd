#!/usr/bin/env python3
"""PyTorch references for bench/keras_fit_reads.py's sequence models (issue 7): the same
shapes and optimizer, float32 with TF32 off, a training step made like Keras `fit`'s (the batch
copied from pageable host memory, the loss read back every step), wall clock per step.

    python3 bench/torch_seq.py [--models mha,lstm,gru,lstm_loop,gru_loop] [--steps 100] [--json F]

mha: MultiheadAttention(64, 4 heads) over 32 steps of 64 features, residual, LayerNorm, mean
over the steps, Linear(64, 10) (Keras: MultiHeadAttention(4, 16), LayerNormalization,
GlobalAveragePooling1D, Dense(10)). lstm / gru: cuDNN's fused nn.LSTM / nn.GRU(16 -> 64) over 20
steps, Linear(64, 10). lstm_loop / gru_loop: the same cells run one timestep at a time
(nn.LSTMCell / nn.GRUCell in a Python loop), like for like with Keras's generic loop on a GPU
without cuDNN. lstm_masked / gru_masked: Embedding(1000, 16) of right-padded token sequences
(lengths 1..20) packed by length (`pack_padded_sequence`: cuDNN's variable-length path), the
layer's final state into Linear(64, 10) (Keras: Embedding(mask_zero=True) on left-padded
tokens). Batch 64, Adam(1e-3), cross-entropy on logits.
"""
import argparse
import json
import statistics
import time

import torch
from torch import nn

BATCH = 64


class Mha(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(64, 4, batch_first=True)
        self.norm = nn.LayerNorm(64, eps=1e-3)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        h, _ = self.att(x, x, x, need_weights=False)
        return self.out(self.norm(h + x).mean(dim=1))


class Rnn(nn.Module):
    def __init__(self, kind, loop):
        super().__init__()
        self.kind, self.loop = kind, loop
        if loop:
            self.cell = nn.LSTMCell(16, 64) if kind == "lstm" else nn.GRUCell(16, 64)
        else:
            self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(16, 64, batch_first=True)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        if not self.loop:
            y, _ = self.rnn(x)
            return self.out(y[:, -1])
        h = x.new_zeros(x.shape[0], 64)
        c = x.new_zeros(x.shape[0], 64)
        for t in range(x.shape[1]):
            if self.kind == "lstm":
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
        return self.out(h)


class MaskedRnn(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(1000, 16, padding_idx=0)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(16, 64, batch_first=True)
        self.out = nn.Linear(64, 10)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.rnn(packed)
        return self.out((h[0] if isinstance(h, tuple) else h)[0])


def masked_tokens(rng_seed=0, steps=20):
    """Right-padded tokens [BATCH, steps] (int64) and their lengths (1..steps, on the CPU)."""
    g = torch.Generator().manual_seed(rng_seed)
    lengths = torch.randint(1, steps + 1, (BATCH,), generator=g)
    x = torch.randint(1, 1000, (BATCH, steps), generator=g)
    x[torch.arange(steps)[None, :] >= lengths[:, None]] = 0
    return x, lengths


def build(name):
    if name == "mha":
        return Mha(), (32, 64)
    if name.endswith("_masked"):
        return MaskedRnn(name.split("_")[0]), None
    kind, _, loop = name.partition("_")
    return Rnn(kind, bool(loop)), (20, 16)


def make_step(name):
    """A training step of model `name` as Keras `fit` makes one (float32, TF32 off): the batch
    copied from pageable host memory, Adam, the loss read back. Returns the step function."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model, shape = build(name)
    model = model.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    if shape is None:
        hx, lengths = masked_tokens()
        extra = (lengths,)
    else:
        hx, extra = torch.randn((BATCH,) + shape), ()
    hy = torch.randint(0, 10, (BATCH,))
    lossf = nn.CrossEntropyLoss()

    def step():
        x, y = hx.to(dev), hy.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x, *extra), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def run(name, steps, warmup, reps):
    step = make_step(name)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / steps * 1e3)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mha,lstm,gru,lstm_loop,gru_loop")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {}
    for name in a.models.split(","):
        ms = run(name, a.steps, a.warmup, a.reps)
        res[name] = {"ms_per_step": ms, "median": statistics.median(ms)}
        print(f"{name:10s} {statistics.median(ms):8.3f} ms/step (runs "
              + ", ".join(f"{v:.3f}" for v in ms) + ")", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
