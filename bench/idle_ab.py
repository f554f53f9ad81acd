#!/usr/bin/env python3
"""The runtime's idle rule (when an open batch goes to an idle GPU: `TFWGPU_BATCH_IDLE_US`,
`TFWGPU_BATCH_IDLE_RULE`), A/B within one process (issue 7). Processes of one device call ran
the same step up to 2.7x apart (bench/RESULTS.md, session 18), so variants in separate
processes compare host speeds more than rules; here the rule is switched between blocks of one
process (the plugin's `tfwgpu_set_batch_idle`) and the blocks' order rotates by round.

Per block: the Keras model of bench/keras_models.py (`--model`, the CNN by default; batch 64),
`--train` fit steps (ms per step
over the fit call, as keras_models.measure times it) and `--infer` calls of its inference
tf.function (N calls then one read, ms per call); with two or more tfwgpu GPUs
(`TFWGPU_VISIBLE_DEVICES=0,0` makes one adapter two) also `--mirrored` fit steps of
bench/mirrored.py's MirroredStrategy CNN at `--per-gpu-batch`. Prints each variant's median over
the rounds and writes JSON.

    python bench/idle_ab.py [--model cnn|mlp|resnet|resnet50] [--variants age:50,quiet:50,off,age:150] [--rounds 5]
        [--train 150] [--infer 300] [--mirrored 40] [--per-gpu-batch 256] [--json FILE]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_variants(s):
    out = []
    for v in s.split(","):
        v = v.strip()
        if v == "off":
            out.append((v, 0, 0))
            continue
        rule, _, us = v.partition(":")
        if rule not in ("age", "quiet") or not us.isdigit():
            raise SystemExit(f"bad variant {v!r}: age:US, quiet:US or off")
        out.append((v, int(us), int(rule == "quiet")))
    return out


def setter():
    import tensorflow_wgpu

    # The copy TensorFlow loaded: another copy would open a runtime of its own, and the A/B
    # would change nothing that TensorFlow runs.
    path = tensorflow_wgpu._loaded_plugin_path()
    if not path:
        raise SystemExit("TensorFlow has not loaded the tfwgpu plugin")
    lib = ctypes.CDLL(path)
    fn = lib.tfwgpu_set_batch_idle
    fn.argtypes = [ctypes.c_int64, ctypes.c_int32]
    fn.restype = ctypes.c_int32
    return fn


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--variants", default="age:50,quiet:50,off,age:150")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train", type=int, default=150)
    p.add_argument("--infer", type=int, default=300)
    p.add_argument("--mirrored", type=int, default=40, help="fit steps per block (0: none)")
    p.add_argument("--per-gpu-batch", type=int, default=256)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if min(a.rounds, a.train, a.infer) < 1:
        raise SystemExit("--rounds, --train and --infer must be at least 1")
    variants = parse_variants(a.variants)
    import keras
    import tensorflow as tf

    import keras_models

    gpus_loaded = tf.config.list_physical_devices("GPU")  # the plugin is loaded by now
    set_idle = setter() if gpus_loaded else None
    if set_idle is None:
        raise SystemExit("no tfwgpu GPU")
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    model, ds, xd, infer = keras_models.prepare(tf, keras, a.model, "/GPU:0", keras_models.BATCH)
    with tf.device("/GPU:0"):
        model.fit(ds, steps_per_epoch=min(20, a.train), epochs=1, verbose=0, shuffle=False)
        for _ in range(min(50, a.infer)):
            out = infer(xd)
        out.numpy()
    mirrored = None
    if a.mirrored and len(gpus) > 1:
        import mirrored as mirrored_bench

        strategy = tf.distribute.MirroredStrategy(gpus)
        mirrored = mirrored_bench.prepare(keras, strategy, a.per_gpu_batch, a.mirrored)
    res = {v[0]: {"train_ms": [], "infer_ms": [], "mirrored_ms": []} for v in variants}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for name, us, quiet in order:
            changed = set_idle(us, quiet)
            if changed < 1:
                raise SystemExit(f"tfwgpu_set_batch_idle({us}, {quiet}) returned {changed}")
            with tf.device("/GPU:0"):
                t0 = time.perf_counter()
                model.fit(ds, steps_per_epoch=a.train, epochs=1, verbose=0, shuffle=False)
                res[name]["train_ms"].append((time.perf_counter() - t0) / a.train * 1e3)
                t0 = time.perf_counter()
                for _ in range(a.infer):
                    out = infer(xd)
                out.numpy()
                res[name]["infer_ms"].append((time.perf_counter() - t0) / a.infer * 1e3)
            if mirrored:
                m, x, y, batch = mirrored
                t0 = time.perf_counter()
                m.fit(x, y, batch_size=batch, epochs=1, verbose=0)
                steps = len(x) // batch
                res[name]["mirrored_ms"].append((time.perf_counter() - t0) / steps * 1e3)
            print(f"round {r} {name}: train {res[name]['train_ms'][-1]:.3f} ms/step, infer "
                  f"{res[name]['infer_ms'][-1]:.3f} ms/call"
                  + (f", mirrored {res[name]['mirrored_ms'][-1]:.3f} ms/step" if mirrored else ""),
                  flush=True)
    summary = {}
    for name, _, _ in variants:
        summary[name] = {k: statistics.median(v) for k, v in res[name].items() if v}
        print(f"{name:10s} medians: " + ", ".join(f"{k} {v:.3f}" for k, v in summary[name].items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpus": gpus, "rounds": a.rounds, "blocks": res, "medians": summary}, f, indent=1)


if __name__ == "__main__":
    main()
