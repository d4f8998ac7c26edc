#!/usr/bin/env python3
"""Plots transport_bench CSVs: GB/s and latency against tensor size, one line
per transport (proto is the plain protobuf stream, the baseline).

usage: bench/transport/plot.py RESULTS.csv [MORE.csv ...] [--out DIR]
Writes <name>-throughput.png and <name>-latency.png beside each CSV (or in DIR).
"""
import argparse
import csv
import os
import sys


def load(path):
    series = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            series.setdefault(row["transport"], []).append(
                (int(row["bytes"]), float(row["gb_per_s"]), float(row["latency_us"])))
    for points in series.values():
        points.sort()
    return series


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--out", help="folder for the pictures (default: beside each CSV)")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py needs matplotlib (Debian: python3-matplotlib)")
    for path in args.csv:
        series = load(path)
        name = os.path.splitext(os.path.basename(path))[0]
        out = args.out or os.path.dirname(os.path.abspath(path))
        for column, label, suffix in ((1, "GB/s", "throughput"), (2, "latency (us)", "latency")):
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            for transport, points in sorted(series.items()):
                ax.plot([b / 2**20 for b, *_ in points], [pt[column] for pt in points], marker="o", label=transport)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tensor size (MiB)")
            ax.set_ylabel(label)
            ax.set_title("%s: %s by transport" % (name, suffix))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            fig.tight_layout()
            target = os.path.join(out, "%s-%s.png" % (name, suffix))
            fig.savefig(target, dpi=100)
            plt.close(fig)
            print("wrote", target)


if __name__ == "__main__":
    main()
