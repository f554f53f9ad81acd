#!/usr/bin/env python3
"""PyTorch on CUDA: the reference models of tensorflow_wgpu.models (mlp, cnn, resnet) and
keras.applications.ResNet50, layer for layer, timed per training and inference step.

    python3 bench/torch_models.py [--models mlp,cnn,resnet,resnet50] [--modes f32,tf32,f16]
                                 [--steps 50] [--warmup 10] [--feed device|pinned|pageable]
                                 [--json FILE]

What is replicated from Keras (python/tensorflow_wgpu/models.py `build`, and
keras.applications.resnet.ResNet50): layer shapes and order, paddings, strides, activations,
dropout rates, BatchNormalization (Keras momentum 0.99 = PyTorch momentum 0.01, epsilon 1e-3;
ResNet50's BN epsilon 1.001e-5), convolution biases (Keras default use_bias=True, also in
ResNet50), Glorot-uniform kernels and zero biases, the loss (sparse categorical cross-entropy;
for the softmax-output models, mlp and resnet50, computed from clipped probabilities as Keras
does) and the optimizers with Keras's hyperparameters:
  mlp:      784 -> Dense 64 relu -> Dropout 0.2 -> Dense 10 softmax;   Adam(1e-3, eps 1e-7)
  cnn:      Conv 3x3x16 valid -> BN -> ReLU -> MaxPool 2 -> Conv 3x3x32 same -> AvgPool 2 ->
            Dropout 0.25 -> Flatten (1152) -> Dense 10;               SGD(0.02, momentum 0.9)
  resnet:   Conv 3x3x16 stride 2 same relu -> 2 x [DepthwiseConv 3x3 same -> BN -> ReLU ->
            Conv 1x1x16, Add, ReLU] -> GlobalAvgPool -> Dense 10;     AdamW(2e-3, wd 0.004, eps 1e-7)
  resnet50: keras.applications.ResNet50 (v1: the stride in each stage's first 1x1 conv, conv
            biases, 224x224x3, 1000 classes, softmax);               SGD(0.01, momentum 0.9)
Deviation: a "same" convolution with stride 2 pads (0, 1) in TensorFlow and (1, 1) here (same
output shape and arithmetic; only the window offset differs), and ResNet50's ZeroPadding2D
layers are the convolution's/pool's own padding. Flatten runs over NCHW (or channels_last)
order instead of NHWC: the same 1152 features in another order.

Batch sizes: 64 for every model, the batch the Keras reference programs use
(tensorflow_wgpu.models and bench/keras_models.py, and their traces in bench/traces/).
Data: synthetic (normal images, uniform labels), made once on the GPU. With `--feed pinned`
(or `pageable`) each training step first copies the batch from host memory to the GPU, as
Keras `fit` does with a host-side tf.data pipeline (bench/keras_models.py): the same work per
step as the Keras measurement; the default keeps it on the GPU.

Modes: f32 = float32 with TF32 off (cuBLAS/cuDNN exact float32), tf32 = float32 with TF32 on,
f16 = torch.autocast(float16) + GradScaler (TF32 off for what stays float32). cudnn.benchmark
is on. The convolutional models run in both memory formats (contiguous NCHW and
channels_last) and the faster one is reported (both are in the JSON).

Timing: CUDA events around each step (no host sync inside the timed loop, as a training loop
runs); the median of `--steps` steps after `--warmup` steps, and the mean over the whole timed
window (first start event to last end event / steps). Training step = forward, loss, backward,
optimizer step (zero_grad set_to_none). Inference step = model.eval() forward under
torch.inference_mode() (autocast in f16).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("mlp", "cnn", "resnet", "resnet50")
MODES = ("f32", "tf32", "f16")
BATCH = {"mlp": 64, "cnn": 64, "resnet": 64, "resnet50": 64}
INPUT = {"mlp": (1, 28, 28), "cnn": (1, 28, 28), "resnet": (1, 28, 28), "resnet50": (3, 224, 224)}
CLASSES = {"mlp": 10, "cnn": 10, "resnet": 10, "resnet50": 1000}


def glorot(m):
    """Keras defaults: Glorot-uniform kernels, zero biases (BN: gamma 1, beta 0)."""
    for mod in m.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(mod.weight)
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
    return m


def bn(c, eps=1e-3):
    return nn.BatchNorm2d(c, eps=eps, momentum=0.01)


class MLP(nn.Module):
    probs = True

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return torch.softmax(self.fc2(self.drop(F.relu(self.fc1(x)))), dim=1)


class CNN(nn.Module):
    probs = False

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3)  # valid: 26x26
        self.bn = bn(16)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)  # same: 13x13
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(32 * 6 * 6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)  # 13x13
        x = F.avg_pool2d(self.c2(x), 2)  # 6x6
        return self.fc(torch.flatten(self.drop(x), 1))


class SmallResNet(nn.Module):
    probs = False

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, stride=2, padding=1)  # 14x14
        self.dw = nn.ModuleList([nn.Conv2d(16, 16, 3, padding=1, groups=16) for _ in range(2)])
        self.bns = nn.ModuleList([bn(16) for _ in range(2)])
        self.pw = nn.ModuleList([nn.Conv2d(16, 16, 1) for _ in range(2)])
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        h = F.relu(self.stem(x))
        for dw, b, pw in zip(self.dw, self.bns, self.pw):
            r = pw(F.relu(b(dw(h))))
            h = F.relu(h + r)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class Bottleneck(nn.Module):
    """keras.applications.resnet block1: 1x1 (stride s) -> 3x3 -> 1x1 (4x), BN after each
    (epsilon 1.001e-5), a projection shortcut (1x1 stride s + BN) in the first block of a
    stage, ReLU after the add."""

    def __init__(self, cin, filters, stride, shortcut):
        super().__init__()
        eps = 1.001e-5
        self.short = nn.Sequential(nn.Conv2d(cin, 4 * filters, 1, stride=stride), bn(4 * filters, eps)) if shortcut else None
        self.c1 = nn.Conv2d(cin, filters, 1, stride=stride)
        self.b1 = bn(filters, eps)
        self.c2 = nn.Conv2d(filters, filters, 3, padding=1)
        self.b2 = bn(filters, eps)
        self.c3 = nn.Conv2d(filters, 4 * filters, 1)
        self.b3 = bn(4 * filters, eps)

    def forward(self, x):
        s = self.short(x) if self.short is not None else x
        h = F.relu(self.b1(self.c1(x)))
        h = F.relu(self.b2(self.c2(h)))
        return F.relu(self.b3(self.c3(h)) + s)


class ResNet50(nn.Module):
    """keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)."""

    probs = True

    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3)  # ZeroPadding2D(3) + valid conv
        self.bn1 = bn(64, 1.001e-5)
        blocks, cin = [], 64
        for filters, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(n):
                blocks.append(Bottleneck(cin, filters, stride if i == 0 else 1, i == 0))
                cin = 4 * filters
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, stride=2, padding=1)  # ZeroPadding2D(1) + MaxPool 3/2 valid
        x = self.blocks(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return torch.softmax(self.fc(x), dim=1)


def build(name):
    """The model and its optimizer (Keras hyperparameters)."""
    if name == "mlp":
        m = glorot(MLP())
        return m, lambda p: torch.optim.Adam(p, lr=1e-3, eps=1e-7)
    if name == "cnn":
        m = glorot(CNN())
        return m, lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9)
    if name == "resnet":
        m = glorot(SmallResNet())
        return m, lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=0.004, eps=1e-7)
    if name == "resnet50":
        m = glorot(ResNet50())
        return m, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)
    raise ValueError(name)


def loss_fn(out, y, probs):
    """Keras's sparse categorical cross-entropy: from logits, or from probabilities clipped
    to [1e-7, 1 - 1e-7]."""
    if probs:
        p = out.float().clamp(1e-7, 1 - 1e-7)
        return F.nll_loss(torch.log(p), y)
    return F.cross_entropy(out.float(), y)


def set_mode(mode):
    tf32 = mode == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True


def timed(fn, steps, warmup):
    """Median and mean per-step time (ms) of `fn` by CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ev]
    return statistics.median(ms), ev[0][0].elapsed_time(ev[-1][1]) / steps, ms


def run_one(name, mode, channels_last, steps, warmup, seed=0, feed="device"):
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    set_mode(mode)
    model, make_opt = build(name)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(dev, memory_format=fmt)
    opt = make_opt(model.parameters())
    b = BATCH[name]
    x = torch.randn((b,) + INPUT[name], device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, CLASSES[name], (b,), device=dev)
    # feed "device": the batch stays on the GPU. "pinned"/"pageable": every training step copies
    # the batch from host memory first, as Keras fit does with a host-side tf.data pipeline
    # ("pinned": what a DataLoader with pin_memory=True hands to .to(non_blocking=True)).
    hx = hy = None
    if feed != "device":
        hx, hy = x.cpu(), y.cpu()
        if feed == "pinned":
            hx, hy = hx.pin_memory(), hy.pin_memory()
    f16 = mode == "f16"
    scaler = torch.amp.GradScaler("cuda", enabled=f16)
    probs = model.probs
    losses = []

    def train_step():
        xb, yb = x, y
        if hx is not None:
            xb = hx.to(dev, non_blocking=feed == "pinned")
            yb = hy.to(dev, non_blocking=feed == "pinned")
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=f16):
            out = model(xb)
        loss = loss_fn(out, yb, probs)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())

    model.train()
    train_med, train_mean, train_ms = timed(train_step, steps, warmup)
    last = [float(l) for l in losses[-3:]]

    def infer_step():
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=f16):
            return model(x)

    model.eval()
    infer_med, infer_mean, infer_ms = timed(infer_step, steps, warmup)
    return {
        "batch": b,
        "feed": feed,
        "channels_last": channels_last,
        "train_ms": train_med,
        "train_ms_mean": train_mean,
        "infer_ms": infer_med,
        "infer_ms_mean": infer_mean,
        "train_images_per_s": b / train_med * 1e3,
        "infer_images_per_s": b / infer_med * 1e3,
        "last_losses": last,
        "finite": all(math.isfinite(l) for l in last),
        "train_ms_all": [round(v, 4) for v in train_ms],
        "infer_ms_all": [round(v, 4) for v in infer_ms],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--layouts", choices=("both", "nchw", "channels_last"), default="both",
                   help="memory formats tried for the convolutional models (mlp: nchw only)")
    p.add_argument("--feed", choices=("device", "pinned", "pageable"), default="device",
                   help="training input: kept on the GPU, or copied from pinned/pageable host memory every step")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("torch_models.py needs CUDA")
    props = torch.cuda.get_device_properties(0)
    out = {
        "device": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "steps": a.steps,
        "warmup": a.warmup,
        "feed": a.feed,
        "batch": BATCH,
        "results": {},
    }
    print(f"{out['device']}, torch {out['torch']}, CUDA {out['cuda']}, cuDNN {out['cudnn']}", flush=True)
    t0 = time.time()
    for name in a.models.split(","):
        res = out["results"].setdefault(name, {})
        for mode in a.modes.split(","):
            if name == "mlp" or a.layouts == "nchw":
                layouts = [False]
            elif a.layouts == "channels_last":
                layouts = [True]
            else:
                layouts = [False, True]
            tries = {("channels_last" if cl else "nchw"): run_one(name, mode, cl, a.steps, a.warmup, feed=a.feed) for cl in layouts}
            best = min(tries.values(), key=lambda r: r["train_ms"])
            r = {k: v for k, v in best.items() if not k.endswith("_all")}
            r["layouts"] = {k: {kk: v[kk] for kk in ("train_ms", "infer_ms", "train_ms_mean", "infer_ms_mean")} for k, v in tries.items()}
            r["train_ms_all"] = best["train_ms_all"]
            res[mode] = r
            print(f"{name:9s} {mode:5s} batch {r['batch']:3d} train {r['train_ms']:8.3f} ms/step "
                  f"(mean {r['train_ms_mean']:.3f})  infer {r['infer_ms']:8.3f} ms/step  "
                  f"{'channels_last' if r['channels_last'] else 'nchw'}  loss {r['last_losses'][-1]:.4f}"
                  f"{'' if r['finite'] else '  NON-FINITE'}", flush=True)
    out["seconds"] = time.time() - t0
    print()
    print(f"{'model':9s} {'batch':>5s} " + " ".join(f"{m + ' train':>11s} {m + ' infer':>11s}" for m in a.modes.split(",")) + "   (ms/step, median)")
    for name, res in out["results"].items():
        print(f"{name:9s} {BATCH[name]:5d} " + " ".join(f"{res[m]['train_ms']:11.3f} {res[m]['infer_ms']:11.3f}" for m in res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
