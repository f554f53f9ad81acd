"""The fallback report: which ops of a program ran on the tfwgpu GPU and which fell back to the
CPU, with counts, and the device-to-host copies the fallbacks cost.

    python -m tensorflow_wgpu.report [--json FILE] [--summary] script.py [script args...]
    python -m tensorflow_wgpu.report [--json FILE] [--summary] -m module [module args...]

The script runs unchanged, in a child process, with TensorFlow's device-placement logging on
(the placement lines are taken out of its output). Counts come from three places: TensorFlow's
placement log (every eager op execution, every graph node placed), an eager op callback (the
device scope each eager op was asked to run in) and the plugin's own counters (every kernel
execution on the GPU, every copy between host and device).

What counts as a fallback: a node placed on the CPU inside a graph that also has nodes on the
GPU, and an eager op that ran on the CPU although the program did not ask for the CPU. Work the
program put on the CPU itself (a `tf.device("/CPU:0")` scope, a graph placed entirely on the
host such as a tf.data function or a model trained on the CPU for comparison) is listed in its
own columns, not counted as a fallback. Host-memory bookkeeping (shapes, constants, variable
handles) never counts.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

# Ops that run on the host by design: shapes and other small host-memory arithmetic, and
# graph bookkeeping. They are listed, but not counted as fallbacks.
HOST_BY_DESIGN = {
    "Const", "Shape", "ShapeN", "Size", "Rank", "BroadcastArgs", "BroadcastGradientArgs",
    "NoOp", "Identity", "IdentityN", "Placeholder", "StopGradient", "ReadVariableOp",
    "VarHandleOp", "VarIsInitializedOp", "DestroyResourceOp", "AssignVariableOp",
}

# tf.data runs on the host by design too.
# (ShuffleDatasetV3, DatasetCardinality, AnonymousIteratorV3, IteratorGetNext, DeleteIterator...)
_HOST_PATTERN = re.compile(r"Dataset|Iterator|SeedGenerator$|^Optional\w+$")


def host_by_design(op):
    return op in HOST_BY_DESIGN or bool(_HOST_PATTERN.search(op))


_PLACED = re.compile(
    r"(?P<tid>\d+) placer\.cc:\d+\] (?P<node>.+?): \((?P<op>[A-Za-z0-9_]+)\): (?P<dev>/job:\S+)\s*$"
)
_TID = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+(?P<tid>\d+) ")
_EXEC = re.compile(r"execute\.cc:\d+\] Executing op (?P<op>\S+) in device (?P<dev>\S+)")
_PRINTED = re.compile(r"^.+?: \([A-Za-z0-9_]+\): /job:\S+$")

_RUNNER = r"""
import atexit, collections, json, os, runpy, sys
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import op_callbacks

tf.debugging.set_log_device_placement(True)
_user_cpu = collections.Counter()

def _scope(op_type, inputs, attrs, outputs, op_name=None, graph=None):
    # (Ops of graphs built inside control flow, a Keras LSTM's while loop, come as bytes.)
    if isinstance(op_type, bytes):
        op_type = op_type.decode()
    # Eager ops run inside an explicit CPU device scope were put there by the program.
    if graph is None and not op_type.startswith("_") and ":CPU:" in (context.context().device_name or ""):
        _user_cpu[op_type] += 1

op_callbacks.add_op_callback(_scope)

@atexit.register
def _write():
    with open(os.environ["TFWGPU_REPORT_SCOPES"], "w") as f:
        json.dump(_user_cpu, f)

if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
"""


def _device_kind(dev):
    m = re.search(r"device:([A-Z_]+):(\d+)", dev)
    return f"{m.group(1)}:{m.group(2)}" if m else dev


class Report:
    """Counts gathered from one run."""

    def __init__(self):
        self.executed = collections.Counter()  # (op, device) -> eager executions
        self.placed = collections.Counter()  # (op, device) -> nodes placed in mixed graphs
        self.host_graph = collections.Counter()  # op -> nodes placed in host-only graphs
        self.user_cpu = collections.Counter()  # op -> eager runs in an explicit CPU scope
        self.gpu_kernels = {}
        self.d2h = {"copies": 0, "bytes": 0}
        self.h2d = {"copies": 0, "bytes": 0}
        self._blocks = {}  # thread id -> [(op, device)] of the graph being placed

    def _close(self, tid):
        """A graph's placement ended: classify it as mixed or host-only."""
        block = self._blocks.pop(tid, None)
        if not block:
            return
        # Mixed: some real work placed on the GPU (a graph whose only GPU nodes are variable
        # handles or constants, placed back to back with a tf.data function, is not).
        on_gpu = any(not dev.startswith("CPU") and not host_by_design(op) for op, dev in block)
        for op, dev in block:
            if on_gpu or not dev.startswith("CPU"):
                self.placed[(op, dev)] += 1
            else:
                self.host_graph[op] += 1

    def feed(self, line):
        m = _PLACED.search(line)
        if m:
            op, tid = m.group("op"), m.group("tid")
            # The placer lists a graph's arguments first: an _Arg after other nodes starts
            # the next graph (graphs placed back to back log no line between them).
            if op == "_Arg" and self._blocks.get(tid):
                self._close(tid)
            block = self._blocks.setdefault(tid, [])
            if not op.startswith("_"):
                block.append((op, _device_kind(m.group("dev"))))
            return True
        # Any other line from a thread ends the graph that thread was placing.
        t = _TID.match(line)
        if t:
            self._close(t.group("tid"))
        m = _EXEC.search(line)
        if m:
            op = m.group("op")
            if not op.startswith("__inference_") and not op.startswith("_"):
                self.executed[(op, _device_kind(m.group("dev")))] += 1
            return True
        return False

    def finish(self):
        for tid in list(self._blocks):
            self._close(tid)

    def fallbacks(self):
        """Op types the program wanted on the GPU that ran on the CPU, less host work by design."""
        ops = collections.Counter()
        for (op, dev), n in self.executed.items():
            if dev.startswith("CPU") and not host_by_design(op):
                ops[op] += n
        for op, n in self.user_cpu.items():
            if op in ops:
                ops[op] -= min(n, ops[op])
        for (op, dev), n in self.placed.items():
            if dev.startswith("CPU") and not host_by_design(op):
                ops[op] += n
        return collections.Counter({op: n for op, n in ops.items() if n > 0})

    def as_dict(self):
        rows = collections.defaultdict(lambda: collections.Counter())
        for (op, dev), n in self.executed.items():
            rows[op][f"eager:{dev}"] += n
        for (op, dev), n in self.placed.items():
            rows[op][f"graph:{dev}"] += n
        for op, n in self.host_graph.items():
            rows[op]["host_graph"] += n
        for op, n in self.user_cpu.items():
            rows[op]["eager_user_cpu"] += n
        for op, n in self.gpu_kernels.items():
            rows[op]["gpu_kernel_runs"] += n
        return {
            "ops": {op: dict(c) for op, c in sorted(rows.items())},
            "fallbacks": dict(self.fallbacks()),
            "device_to_host": self.d2h,
            "host_to_device": self.h2d,
        }

    def text(self, title, summary_only=False):
        d = self.as_dict()
        fb = d["fallbacks"]
        lines = [f"tfwgpu fallback report: {title}"]
        table = []
        table.append(
            f"  {'op':<34}{'GPU runs':>10}{'graph GPU':>10}{'graph CPU':>10}{'eager CPU':>10}"
            f"{'host graph':>11}{'user CPU':>10}"
        )
        for op, c in d["ops"].items():
            gpu = c.get("gpu_kernel_runs", 0)
            g_gpu = sum(v for k, v in c.items() if k.startswith("graph:GPU"))
            g_cpu = sum(v for k, v in c.items() if k.startswith("graph:CPU"))
            e_cpu = sum(v for k, v in c.items() if k.startswith("eager:CPU"))
            host, user = c.get("host_graph", 0), c.get("eager_user_cpu", 0)
            mark = "  <- CPU fallback" if op in fb else ""
            table.append(f"  {op:<34}{gpu:>10}{g_gpu:>10}{g_cpu:>10}{e_cpu:>10}{host:>11}{user:>10}{mark}")
        if not summary_only:
            lines += table
        gpu_types = sum(1 for c in d["ops"].values() if any("GPU" in k or k == "gpu_kernel_runs" for k in c))
        lines.append(
            f"  summary: {gpu_types} op types on GPU, {len(fb)} op types fell back to the CPU"
            + (f" ({', '.join(sorted(fb))})" if fb else "")
        )
        lines.append(
            f"  device-to-host copies: {self.d2h['copies']} ({self.d2h['bytes'] / 2**20:.1f} MiB); "
            f"host-to-device copies: {self.h2d['copies']} ({self.h2d['bytes'] / 2**20:.1f} MiB)"
        )
        return "\n".join(lines)


def _pump(stream, out, report, lock, drop_printed):
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        with lock:
            consumed = report.feed(line)
        if consumed or (drop_printed and _PRINTED.match(line.rstrip("\n"))):
            continue
        out.write(line)
        out.flush()


def run(script, args, json_path=None, out=sys.stdout, err=sys.stderr):
    """Runs `script` with `args` in a child process; returns (exit code, Report)."""
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        counters = os.path.join(tmp, "tfwgpu-counters.json")
        scopes = os.path.join(tmp, "tfwgpu-scopes.json")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TFWGPU_REPORT=counters, TFWGPU_REPORT_SCOPES=scopes)
        env.setdefault("PYTHONUNBUFFERED", "1")
        child = subprocess.Popen(
            [sys.executable, "-c", _RUNNER, script, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        lock = threading.Lock()
        threads = [
            threading.Thread(target=_pump, args=(child.stdout, out, report, lock, True)),
            threading.Thread(target=_pump, args=(child.stderr, err, report, lock, False)),
        ]
        for t in threads:
            t.start()
        code = child.wait()
        for t in threads:
            t.join()
        report.finish()
        if os.path.exists(scopes):
            with open(scopes) as f:
                report.user_cpu = collections.Counter(json.load(f))
        if os.path.exists(counters):
            with open(counters) as f:
                c = json.load(f)
            report.gpu_kernels = c.get("gpu_ops", {})
            report.d2h = c.get("device_to_host", report.d2h)
            report.h2d = c.get("host_to_device", report.h2d)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    return code, report


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tensorflow_wgpu.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--summary", action="store_true", help="print the summary lines only, not the table")
    p.add_argument("-m", dest="module", help="run a module as a script (like python -m)")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `-m module` belongs to the module, as with python -m.
    module_args = []
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        i = argv.index("-m")
        argv, module_args = argv[: i + 2], argv[i + 2 :]
    a = p.parse_args(argv)
    if a.module:
        code, report = run("-m", [a.module, *module_args], a.json)
        title = f"-m {a.module}"
    elif a.script:
        code, report = run(a.script, a.args, a.json)
        title = a.script
    else:
        p.error("a script or -m module is required")
    print(report.text(title, a.summary), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
