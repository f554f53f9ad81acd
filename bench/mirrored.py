"""Multi-GPU scaling of Keras training on tfwgpu devices: the demo's CNN (tensorflow_wgpu.demo)
trained with fit on one device and with tf.distribute.MirroredStrategy over every tfwgpu GPU,
same per-GPU batch, synthetic Fashion-MNIST-shaped data. Prints images/s and the scaling
efficiency, and writes JSON.

Two throughputs per setting: `images_per_s` is the steady state (global batch / mean time of
the timed epoch's steps, each step timed from one on_train_batch_begin to the next; the first
`--skip` steps and the last one, which carries the epoch's end, are left out), and
`fit_images_per_s` divides the images by the whole `fit` call, which also counts fit's own
start (for MirroredStrategy, distributing the dataset and building per-replica iterators:
hundreds of ms in TensorFlow before the first step) and end. The speedup is taken on the steady
state; both are reported.

    python bench/mirrored.py [--per-gpu-batch 256] [--steps 200] [--skip 5] [--json FILE]
        [--only one|all] [--cross-device-ops default|collective|one_device|hierarchical|exchange]
        [--host-budget R]
        [--bytes-per-pack N]

`--cross-device-ops` picks MirroredStrategy's all-reduce: `default` is what a user gets from
`MirroredStrategy()` with the plugin installed (ReductionToOneDevice over tfwgpu GPUs, see
tensorflow_wgpu/_hooks.py), `collective` is TensorFlow's own default
(CollectiveAllReduce; on devices without NCCL a ring of CollectiveReduceV2 ops),
`one_device` is ReductionToOneDevice (sum on the first GPU, then copies back),
`hierarchical` is HierarchicalCopyAllReduce (packed AddN on the devices and copies),
`exchange` is tensorflow_wgpu's exchange all-reduce (TFWGPU_MIRRORED_REDUCE=exchange: every
device sums all the replicas' gradients itself, one host round trip per gradient).
`--bytes-per-pack N` (with `collective`) splits the gradients into packs of about N bytes, each
all-reduced by its own collective (TensorFlow's CommunicationOptions.bytes_per_pack, set as the
strategy's default options: Keras's all_reduce passes none), so that the first pack's hops can
start before the whole backward pass has run. The default (0) is one pack.

`--host-budget R` measures, instead of the throughput, where each setting's step spends host
time, R times (fit of `--steps` steps after the warm-up): wall ms per step, wall ms inside Keras's
train_function and inside its `has_value()` read, CPU ms per step of each group of threads
(/proc/self/task, grouped as in bench/keras_models.py: `main` = the Python thread running fit;
`tf_*` = TensorFlow's inter-op threads, which run the kernels and so the plugin's compute
callback; `tfwgpu-*` = the plugin's threads; `foreign` = other native threads, on lavapipe its
execution threads = the "GPU"), and the plugin's counters per step (kernel calls, copies,
stream-executor calls and the wall time inside them, runtime submits and reads, and with
TFWGPU_HOST_TIMERS=1 the compute callback's CPU time by phase).
"""
import argparse
import json
import os
import statistics
import time

import numpy as np


try:
    import tensorflow_wgpu
except ImportError:
    tensorflow_wgpu = None


def StepMarks(keras, label):
    """Marks each step's start in a TFWGPU_TRACE trace (a no-op without TFWGPU_TRACE)."""

    class Marks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            tensorflow_wgpu.trace_mark(label)

    return Marks()


class StepTimes:
    """Host time at each step's begin (a Keras callback, built lazily to keep keras optional)."""

    def __init__(self, keras):
        times = self.times = []

        class C(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                times.append(time.perf_counter())

            def on_train_end(self, logs=None):
                times.append(time.perf_counter())

        self.callback = C()

    def steps_ms(self):
        t = self.times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


def prepare(keras, strategy, per_gpu_batch, steps):
    from tensorflow_wgpu.demo import build_model

    n = strategy.num_replicas_in_sync
    batch = per_gpu_batch * n
    rng = np.random.default_rng(0)
    x = rng.random((batch * steps, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, batch * steps).astype("int32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model(keras)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    # Warm-up: tracing, pipelines, allocator growth.
    model.fit(x[: batch * 5], y[: batch * 5], batch_size=batch, epochs=1, verbose=0)
    return model, x, y, batch


def run(tf, keras, strategy, per_gpu_batch, steps, skip):
    n = strategy.num_replicas_in_sync
    model, x, y, batch = prepare(keras, strategy, per_gpu_batch, steps)
    marks = [StepMarks(keras, f"{n}gpu")] if tensorflow_wgpu else []
    timer = StepTimes(keras)
    t0 = time.perf_counter()
    h = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=marks + [timer.callback])
    dt = time.perf_counter() - t0
    if marks:
        tensorflow_wgpu.trace_mark("end")
    ms = timer.steps_ms()
    # The last interval runs from the last step's begin to the end of training: it holds the
    # epoch's end (callbacks, logs), not only a step.
    steady = ms[skip:-1]
    mean = statistics.fmean(steady)
    return {
        "replicas": n,
        "global_batch": batch,
        "images_per_s": batch / mean * 1e3,
        "step_ms_mean": mean,
        "step_ms_median": statistics.median(steady),
        "step_ms_p90": sorted(steady)[int(0.9 * (len(steady) - 1))],
        "steps_timed": len(steady),
        "fit_images_per_s": len(x) / dt,
        "fit_s": dt,
        "before_first_step_s": timer.times[0] - t0,
        "last_step_and_end_ms": ms[-1],
        "loss": h.history["loss"][-1],
    }


def host_budget(tf, keras, strategy, per_gpu_batch, steps, reps):
    """Where the step's host time goes (see the module doc), `reps` times."""
    import os
    import sys
    import threading

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from keras_models import _group, _plugin_counters, _threads, _timed_has_value

    n = strategy.num_replicas_in_sync
    model, x, y, batch = prepare(keras, strategy, per_gpu_batch, steps)
    spent = {"train_function": 0.0, "has_value": 0.0}
    f = model.train_function

    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            spent["train_function"] += time.perf_counter() - t

    model.train_function = timed
    # fit would rebuild train_function unless it is kept.
    model.make_train_function = lambda force=False: None
    runs = []
    with _timed_has_value(tf, spent):
        for _ in range(reps):
            for k in spent:
                spent[k] = 0.0
            main_tid = threading.main_thread().native_id
            c0, th0 = _plugin_counters(), _threads()
            t0 = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
            wall = (time.perf_counter() - t0) / steps * 1e3
            th1, c1 = _threads(), _plugin_counters()
            py_tids = {t.native_id for t in threading.enumerate()}
            cpu = {}
            for tid, (tname, sec) in th1.items():
                g = _group(tid, tname, main_tid, py_tids)
                cpu[g] = cpu.get(g, 0.0) + (sec - th0.get(tid, (tname, 0.0))[1]) / steps * 1e3
            r = {"wall_ms": wall,
                 "cpu_ms": {k: round(v, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
                 "wall_ms_in": {k: round(v / steps * 1e3, 4) for k, v in spent.items()}}
            if c0 is not None and c1 is not None:
                r["per_step"] = {k: round((c1[k] - c0.get(k, 0)) / steps, 3) for k in c1}
            runs.append(r)
            print(f"{n} replica(s), batch {batch}: {wall:.3f} ms/step (in train_function "
                  f"{r['wall_ms_in']['train_function']:.3f}, has_value + read "
                  f"{r['wall_ms_in']['has_value']:.3f}); CPU ms/step "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms"].items() if v >= 0.005), flush=True)
            if "per_step" in r:
                ps = r["per_step"]
                print("   per step: " + ", ".join(f"{k} {v:g}" for k, v in ps.items() if v and not k.endswith("wall_us")), flush=True)
                print("   SE wall us/step: " + ", ".join(f"{k[3:-8]} {v:.1f}" for k, v in ps.items() if k.endswith("wall_us") and v), flush=True)
    return {"replicas": n, "global_batch": batch, "steps": steps, "runs": runs}


def cross_device_ops(tf, name):
    if name == "default":
        return None
    if name == "collective":
        # TensorFlow's own choice: the plugin's hook steps aside.
        os.environ["TFWGPU_MIRRORED_REDUCE"] = "tensorflow"
        return None
    if name == "one_device":
        return tf.distribute.ReductionToOneDevice()
    if name == "exchange":
        # tensorflow_wgpu's exchange all-reduce (TFWGPU_MIRRORED_REDUCE=exchange).
        os.environ["TFWGPU_MIRRORED_REDUCE"] = "exchange"
        return None
    if name == "hierarchical":
        return tf.distribute.HierarchicalCopyAllReduce()
    raise SystemExit(f"unknown --cross-device-ops {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per-gpu-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--skip", type=int, default=5, help="steps left out at the start of the timed epoch")
    p.add_argument("--json")
    p.add_argument("--only", choices=["one", "all"], help="run one setting only")
    p.add_argument("--cross-device-ops", default="default",
                   choices=["default", "collective", "one_device", "hierarchical", "exchange"])
    p.add_argument("--bytes-per-pack", type=int, default=0)
    p.add_argument("--host-budget", type=int, metavar="R",
                   help="measure where the step's host time goes R times instead of the throughput")
    a = p.parse_args()
    import keras
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    res = {"gpus": gpus, "cross_device_ops": a.cross_device_ops}

    def measure(strategy):
        if a.host_budget:
            return host_budget(tf, keras, strategy, a.per_gpu_batch, a.steps, a.host_budget)
        return run(tf, keras, strategy, a.per_gpu_batch, a.steps, a.skip)

    if a.only != "all":
        res["one"] = measure(tf.distribute.OneDeviceStrategy(gpus[0]))
    if len(gpus) > 1 and a.only != "one":
        ops = cross_device_ops(tf, a.cross_device_ops)
        strategy = tf.distribute.MirroredStrategy(gpus, cross_device_ops=ops)
        if a.bytes_per_pack:
            from tensorflow.python.distribute import collective_util

            ext = strategy.extended
            ext._communication_options = collective_util.Options(
                bytes_per_pack=a.bytes_per_pack,
                implementation=ext._communication_options.implementation)
            res["bytes_per_pack"] = a.bytes_per_pack
        res["all"] = measure(strategy)
    if "one" in res and "all" in res and not a.host_budget:
        res["speedup"] = res["all"]["images_per_s"] / res["one"]["images_per_s"]
        res["efficiency"] = res["speedup"] / len(gpus)
        res["fit_speedup"] = res["all"]["fit_images_per_s"] / res["one"]["fit_images_per_s"]
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
