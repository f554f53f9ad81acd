"""The host's chain inside the replayed steps of one label (issue 7), from a host log
(`TFWGPU_HOST_LOG=F tfwgpu-bench replay ...`): for each step from a mark with the label to the
next mark (any label; the replay logs a mark after the mark's synchronize, so a step holds its
events, then the closing mark's flush and wait), the time of each kind of span per thread, and
when (us after the mark) the step's first and last dispatch, its submits and its wait began and
ended. Medians over the steps.

    python bench/hostlog_chain.py F [--label infer_step] [--json OUT]
"""

import argparse
import json
import statistics
from collections import defaultdict


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("--label", default="infer_step")
    p.add_argument("--json")
    a = p.parse_args(argv)
    d = json.load(open(a.file))
    kinds, labels, threads = d["kinds"], d["labels"], d["threads"]
    spans = sorted(d["spans"], key=lambda s: s[2])
    marks = [(s[2], labels[s[4]]) for s in spans if kinds[s[0]] == "mark"]
    steps = []
    for i, (t, lab) in enumerate(marks):
        if lab == a.label and i + 1 < len(marks):
            steps.append((t, marks[i + 1][0]))
    per_kind = defaultdict(list)
    events = defaultdict(list)
    counts = defaultdict(list)
    for t0, t_end in steps:
        inside = [s for s in spans if t0 <= s[2] < t_end and kinds[s[0]] != "mark"]
        sums = defaultdict(float)
        for s in inside:
            sums[(kinds[s[0]], threads[s[1]][1])] += (s[3] - s[2]) / 1e3
        for k in set(per_kind) | set(sums):
            per_kind[k].append(sums.get(k, 0.0))
        disp = [s for s in inside if kinds[s[0]] == "dispatch_held"]
        if disp:
            events["first dispatch"].append((disp[0][2] - t0) / 1e3)
            events["last dispatch end"].append((disp[-1][3] - t0) / 1e3)
        subs = [s for s in inside if kinds[s[0]] == "submit"]
        counts["submits"].append(len(subs))
        counts["dispatches"].append(len(disp))
        for j, s in enumerate(subs[:3]):
            events[f"submit {j + 1} ({threads[s[1]][1]}) start"].append((s[2] - t0) / 1e3)
            events[f"submit {j + 1} ({threads[s[1]][1]}) end"].append((s[3] - t0) / 1e3)
        waits = [s for s in inside if kinds[s[0]] == "wait"]
        if waits:
            events["wait (blocking) start"].append((waits[-1][2] - t0) / 1e3)
            events["wait (blocking) end"].append((waits[-1][3] - t0) / 1e3)
        events["next step's mark (all done)"].append((t_end - t0) / 1e3)
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    print(f"{a.file}: {len(steps)} steps {a.label!r} (mark to the next mark)")
    print("  per step (median): " + ", ".join(f"{k} {med(v):g}" for k, v in counts.items()))
    print(f"  {'when (us after the mark)':42s} {'median':>9s} {'steps':>6s}")
    order = sorted(events, key=lambda k: med(events[k]))
    for k in order:
        print(f"  {k:42s} {med(events[k]):9.1f} {len(events[k]):6d}")
    print(f"  {'span kind (thread)':42s} {'us/step':>9s}")
    for k in sorted(per_kind, key=lambda k: -med(per_kind[k])):
        if med(per_kind[k]) >= 0.5:
            print(f"  {k[0] + ' (' + k[1] + ')':42s} {med(per_kind[k]):9.1f}")
    if a.json:
        out = {
            "steps": len(steps),
            "events_us": {k: med(v) for k, v in events.items()},
            "counts": {k: med(v) for k, v in counts.items()},
            "kinds_us": {f"{k[0]}|{k[1]}": med(v) for k, v in per_kind.items()},
        }
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
