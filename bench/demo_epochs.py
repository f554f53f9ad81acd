#!/usr/bin/env python3
"""The demo's training (`tensorflow_wgpu.demo`: its model, data pipeline, batch and optimizer)
timed per epoch, with the plugin's counters per step, so that the first epoch (tracing, pipeline
compiles, tuning) and the steady epochs are told apart.

    python bench/demo_epochs.py [--device /GPU:0] [--epochs 4] [--verbose 1] [--limit N]
                                [--data-dir D] [--json FILE]

Per epoch: wall seconds, images/s, process CPU seconds. For the epochs after the first: per
step, the plugin's device-to-host and host-to-device copies, its kernel runs on the GPU and on
the host, and the runtime's dispatches, submits and reads (`tensorflow_wgpu.stats()`). `--verbose` is passed to `fit`
(the demo uses 1, Keras's progress bar; 0 shows what the bar costs).
"""
import argparse
import json
import os
import sys
import time


def _counts(tensorflow_wgpu):
    s = tensorflow_wgpu.stats()
    rt = s.get("runtime", {})
    return {
        "d2h": s["device_to_host"]["copies"],
        "h2d": s["host_to_device"]["copies"],
        "kernels": sum(s["gpu_ops"].values()),
        "host_kernels": sum(s["host_ops"].values()),
        "dispatches": rt.get("dispatches", 0),
        "submits": rt.get("submits", 0),
        "reads": rt.get("reads", 0),
    }


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="/GPU:0")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--verbose", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--limit", type=int)
    p.add_argument("--data-dir")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json")
    a = p.parse_args(argv)

    from tensorflow_wgpu import demo, fashion_mnist

    kwargs = {"directory": a.data_dir} if a.data_dir else {}
    (x, y), (xt, yt) = fashion_mnist.load(**kwargs)
    if a.limit:
        x, y = x[: a.limit], y[: a.limit]
    x = (x.astype("float32") / 255.0)[..., None]
    xt = (xt.astype("float32") / 255.0)[..., None]
    data = ((x, y.astype("int32")), (xt, yt.astype("int32")))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    import tensorflow_wgpu

    gpu = a.device.upper().startswith("/GPU")
    steps = -(-len(x) // a.batch_size)
    epochs = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = (time.perf_counter(), time.process_time(), _counts(tensorflow_wgpu) if gpu else None)

        def on_epoch_end(self, epoch, logs=None):
            t1, c1 = time.perf_counter(), time.process_time()
            t0, c0, n0 = self.t
            e = {"epoch": epoch + 1, "s": t1 - t0, "cpu_s": c1 - c0, "images_per_s": len(x) / (t1 - t0)}
            if gpu:
                n1 = _counts(tensorflow_wgpu)
                e.update({f"{k}_per_step": (n1[k] - n0[k]) / steps for k in n1})
            e["loss"] = float(logs.get("loss", float("nan"))) if logs else None
            epochs.append(e)
            print(json.dumps(e), flush=True)

    res = demo.train(tf, keras, a.device, data, a.epochs, a.batch_size, a.seed,
                     callbacks=[EpochTimer()], verbose=a.verbose)
    steady = sorted(e["s"] for e in epochs[1:]) or [epochs[0]["s"]]
    out = {
        "device": a.device,
        "verbose": a.verbose,
        "batch_size": a.batch_size,
        "steps_per_epoch": steps,
        "epochs": epochs,
        "steady_ms_per_step": 1e3 * steady[len(steady) // 2] / steps,
        "steady_images_per_s": len(x) / steady[len(steady) // 2],
        "demo": res,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "epochs"}), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
