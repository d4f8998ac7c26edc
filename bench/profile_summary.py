#!/usr/bin/env python3
"""Tabulates operator profiles (Chrome traces): Conveyor's (profile_step,
common/op_profile.cpp) and PyTorch's (torch.profiler's export_chrome_trace),
which use the same event categories.

For each trace: device busy time, the costliest kernels (or, with no device
events, host operators) by total time. Given two traces, a side-by-side table
by kernel name, largest difference first: where one run spends the time the
other does not.

usage: bench/profile_summary.py A.json [B.json] [--top 25] [--host]
"""
import argparse
import collections
import json
import sys

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path, host):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    cats = ("cpu_op",) if host else DEVICE
    totals, counts = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in cats:
            totals[e["name"]] += float(e.get("dur", 0))
            counts[e["name"]] += 1
    if not totals and not host:  # a CPU run: its operators
        return load(path, True)
    launches = sum(1 for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in e.get("name", ""))
    return totals, counts, launches


def short(name, width=70):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--host", action="store_true", help="host operators instead of device kernels")
    a = p.parse_args()
    runs = [load(t, a.host) for t in a.traces[:2]]
    for path, (totals, counts, launches) in zip(a.traces, runs):
        print("%s: %.1f ms in %d events (%d kinds)%s" % (
            path, sum(totals.values()) / 1e3, sum(counts.values()), len(totals),
            ", %d kernel launches seen from the host" % launches if launches else ""))
    if len(runs) == 1:
        totals, counts, _ = runs[0]
        print("\n| ms | calls | name |\n| ---: | ---: | --- |")
        for name, us in totals.most_common(a.top):
            print("| %.2f | %d | %s |" % (us / 1e3, counts[name], short(name)))
        return 0
    (ta, ca, _), (tb, cb, _) = runs
    names = sorted(set(ta) | set(tb), key=lambda n: -abs(ta[n] - tb[n]))
    print("\n| A ms | A calls | B ms | B calls | B - A ms | name |\n| ---: | ---: | ---: | ---: | ---: | --- |")
    for n in names[:a.top]:
        print("| %.2f | %d | %.2f | %d | %+.2f | %s |" % (ta[n] / 1e3, ca[n], tb[n] / 1e3, cb[n], (tb[n] - ta[n]) / 1e3,
                                                         short(n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
