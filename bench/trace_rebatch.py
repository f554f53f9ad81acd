#!/usr/bin/env python3
"""Rewrites a tfwgpu trace captured at one batch size (TFWGPU_TRACE, bench/keras_models.py
--trace) into the trace of the same program at another batch size, for replaying a model on a
GPU host when the capture could only run at a small batch (lavapipe cannot hold ResNet-50's
activations at batch 64: its largest binding is 128 MiB).

What carries the batch, after the `setup` mark (the weights' initialization before it does
not depend on the batch): device tensors whose first dimension is the old batch (activations
[N,H,W,C], logits [N,K], labels [N]: every tensor of a step with that leading dimension); int32
host tensors giving a shape whose first element is the old batch (Conv2DBackpropInput's
input_sizes, Slice's size); the Tile multiples of fused programs (`Tile[Nx...]`); the uploads of
the input batch and labels and the read-back of the logits (sizes that are a multiple of the old
batch's rows: the h2d/d2h events inside steps whose size divides by the old batch, except
scalars). Device addresses are then laid out anew (`relocate`). Kernel dispatch counts are left
as traced (the replay re-records every kernel; the
count is informational there).

Checked by rewriting a batch-2 capture to batch 64 and comparing it with a batch-64 capture of
the same program (ops, shapes, host tensors, programs, transfer sizes equal step by step):

    python3 bench/trace_rebatch.py IN.trace OUT.trace --from 2 --to 64 [--check REF.trace]

bench/traces/resnet50-b2to64-{single,multi}.trace.gz were made so from the batch-2 lavapipe
captures bench/data/2026-11-30-mofuse-lavapipe-r50-b2-{single,multi}.trace.gz (keras_models.py
--models resnet50 --trace DIR --trace-steps 2 --resnet50-batch 2; single: TFWGPU_FUSION_MULTI=0,
the grouping of before multi-output fusion; multi: branch mofuse). The single one's steps equal
bench/traces/resnet50.trace.gz's (the H200 capture) call for call (--check).
bench/traces/resnet50-b2to64-reduce.trace.gz likewise from
bench/data/2026-11-30-redfuse-lavapipe-r50-b2-reduce-final.trace.gz (branch redfuse: reductions
with an elementwise prologue; their reduction_indices are left as they are).
"""
import argparse, gzip, json, re, struct, sys


def load(p):
    op = gzip.open if p.endswith(".gz") else open
    with op(p, "rt") as f:
        return [json.loads(l) for l in f]


def rebatch(evs, old, new):
    out = []
    started = False
    tile = re.compile(r"Tile\[%d(x[0-9x]+)\]" % old)
    for e in evs:
        e = json.loads(json.dumps(e))
        if e["ev"] == "mark" and e["label"] == "setup":
            started = True
        if not started:
            out.append(e)
            continue
        if e["ev"] == "kernel":
            for t in e["inputs"] + e["outputs"]:
                sh = t.get("shape")
                if "host" in t:
                    if t["dtype"] == "int32" and sh and len(sh) == 1 and sh[0] >= 2:
                        b = bytes.fromhex(t["host"])
                        v = list(struct.unpack("<%di" % (len(b) // 4), b))
                        if v and v[0] == old and e["op"] in ("Conv2DBackpropInput", "Slice", "Reshape", "Fill"):
                            v[0] = new
                            t["host"] = struct.pack("<%di" % len(v), *v).hex()
                elif sh and sh[0] == old:
                    sh[0] = new
            p = e.get("attrs", {}).get("program")
            if p:
                p["s"] = tile.sub(lambda m: "Tile[%d%s]" % (new, m.group(1)), p["s"])
        elif e["ev"] in ("h2d", "d2h") and e["size"] > 8 and e["size"] % old == 0:
            e["size"] = e["size"] // old * new
        elif e["ev"] in ("h2d", "d2h") and e["size"] == 4 * old:
            # int32 labels of a batch.
            e["size"] = 4 * new
        out.append(e)
    return out


DTYPE_BYTES = {"float32": 4, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float64": 8,
               "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2, "bool": 1, "uint8": 1,
               "int8": 1, "complex64": 8}


def relocate(evs, base=0x0200000000000000):
    """New device addresses: the traced ones were packed for the old batch's sizes, so larger
    tensors would overlap. Each distinct start address (of a kernel's tensor or a transfer) gets
    an allocation of its own, as large as the largest extent used there (aligned to 256 bytes);
    what shared an address still does (the dataflow the replay follows), views inside another
    tensor become tensors of their own (their data is random in a replay anyway). The traced
    `alloc` events are replaced by one per address, before everything else."""
    extent = {}

    def use(addr, n):
        extent[addr] = max(extent.get(addr, 0), n)

    for e in evs:
        if e["ev"] == "kernel":
            for t in e["inputs"] + e["outputs"]:
                if "addr" in t:
                    n = DTYPE_BYTES[t["dtype"]]
                    for d in t["shape"]:
                        n *= d
                    use(t["addr"], n)
        elif e["ev"] == "h2d":
            use(e["dst"], e["size"])
        elif e["ev"] == "d2h":
            use(e["src"], e["size"])
        elif e["ev"] in ("d2d",):
            use(e["src"], e["size"])
            use(e["dst"], e["size"])
        elif e["ev"] == "fill":
            use(e["addr"] if "addr" in e else e["dst"], e["size"])
    new, at = {}, base
    for a in sorted(extent):
        new[a] = at
        at += max(256, (extent[a] + 255) // 256 * 256)
    out = []
    for e in evs:
        if e["ev"] == "alloc":
            continue
        if e["ev"] == "kernel":
            for t in e["inputs"] + e["outputs"]:
                if "addr" in t:
                    t["addr"] = new[t["addr"]]
        for k in ("dst", "src", "addr"):
            if k in e and e["ev"] != "kernel":
                e[k] = new[e[k]]
        out.append(e)
        if e["ev"] == "header":
            for a in sorted(extent):
                size = max(256, (extent[a] + 255) // 256 * 256)
                out.append({"ev": "alloc", "seq": 0, "dev": 0, "addr": new[a], "size": size,
                            "t_us": 0.0, "thread": 0})
    return out


def steps(evs, label):
    """Per step of `label` (train_step, infer_step): the kernel calls (op, node, shapes, host
    inputs, program) and transfers (sizes), comparable across captures."""
    res, cur = [], None
    for e in evs:
        if e["ev"] == "mark":
            if cur is not None:
                res.append(cur)
            cur = [] if e["label"] == label else None
            continue
        if cur is None:
            continue
        if e["ev"] == "kernel":
            cur.append((e["op"], e["node"],
                        tuple((tuple(t.get("shape", [])), t.get("host")) for t in e["inputs"]),
                        tuple(tuple(t.get("shape", [])) for t in e["outputs"]),
                        e.get("attrs", {}).get("program", {}).get("s")))
        elif e["ev"] in ("h2d", "d2h"):
            cur.append((e["ev"], e["size"]))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--from", dest="old", type=int, required=True)
    ap.add_argument("--to", dest="new", type=int, required=True)
    ap.add_argument("--check", help="a capture at the new batch: compare step by step")
    a = ap.parse_args()
    evs = relocate(rebatch(load(a.inp), a.old, a.new))
    op = gzip.open if a.out.endswith(".gz") else open
    with op(a.out, "wt") as f:
        for e in evs:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    if a.check:
        ref_evs = load(a.check)
        bad = 0
        for label in ("train_step", "infer_step"):
            mine, ref = steps(evs, label), steps(ref_evs, label)
            for k, (s, r) in enumerate(zip(mine, ref)):
                # Kernel calls only: where a read-back lands relative to the marks varies.
                s = sorted(str(x) for x in s if x[0] != "d2h")
                r = sorted(str(x) for x in r if x[0] != "d2h")
                if s != r:
                    bad += 1
                    diff = [x for x in s if x not in r][:3], [x for x in r if x not in s][:3]
                    print(f"{label} {k}: differs ({len(s)} vs {len(r)} events): {diff}")
            print(f"{label}: checked {min(len(mine), len(ref))} steps against {a.check}")
        print(f"{bad} steps differ")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
