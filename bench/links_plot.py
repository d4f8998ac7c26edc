#!/usr/bin/env python3
"""Draws what the shaped links cost the pipeline, from the benchmarks' CSVs.

    bench/links_plot.py OUT.png CONVNET.csv DECODER.csv LINK_AWARE_CUT.csv HOSTS.csv

Six panels. Above and below on the left, bench/slow_links.sh's CSVs of the
Quick start's ConvNet and of the CPU-sized decoder over 2 and 4 CPU hosts as
the link narrows: ms a step on loopback, an unshaped veth, 10 and 1 Gb/s, a
line for each schedule and micro-batch count, the one-process reference
dashed. On the right, the ConvNet over 1 Gb/s cut without and with
`partition.link_gbps` (its CSV of alternating runs: medians, the bars' ends
the fastest and slowest run), and W2 over two GPUs as hosts behind 25 and 100
Gb/s (bench/gpu/hosts.sh's CSV: Conveyor's and pipelining's rows, PyTorch eager
on one GPU dashed). Needs matplotlib (Debian's python3-matplotlib).
"""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

LINK_ORDER = ["loopback", "none", "10gbit", "1gbit"]
LINK_NAMES = {"loopback": "loopback", "none": "veth", "10gbit": "10 Gb/s", "1gbit": "1 Gb/s"}


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def slow_links_panel(ax, table, hosts, title):
    """ms a step against the link over `hosts` hosts, a line for each schedule and micro-batch count."""
    series = {}
    for r in table:
        if int(r["hosts"]) != hosts:
            continue
        key = (r["schedule"], int(r["micro_batches"]))
        series.setdefault(key, {"loopback": float(r["loopback_ms"])})[r["link"]] = float(r["step_ms"])
    xs = range(len(LINK_ORDER))
    for (schedule, m), by_link in sorted(series.items()):
        ax.plot(xs, [by_link.get(link, float("nan")) for link in LINK_ORDER], marker="o", label="%s m%d" % (schedule, m))
    ax.axhline(float(table[0]["reference_ms"]), color="grey", linestyle="--", label="one process")
    ax.set_xticks(list(xs), [LINK_NAMES[link] for link in LINK_ORDER])
    ax.set_ylabel("ms a step")
    ax.set_title("%s, %d CPU hosts (%s)" % (title, hosts, table[0]["date"]))
    ax.legend(fontsize=6, ncol=2)


def cut_panel(ax, table):
    """Medians (and extremes) of the runs cut without and with the link's speed."""
    runs = {}
    for r in table:
        key = (int(r["hosts"]), r["schedule"])
        runs.setdefault(key, {}).setdefault(r["link_gbps_in_job"], []).append(float(r["step_ms"]))
    keys = sorted(runs)
    width = 0.38
    for i, (gbps, label) in enumerate([("0", "cut ignoring the link"), ("1", "cut with link_gbps: 1")]):
        medians = [statistics.median(runs[k].get(gbps, [float("nan")])) for k in keys]
        low = [m - min(runs[k].get(gbps, [m])) for k, m in zip(keys, medians)]
        high = [max(runs[k].get(gbps, [m])) - m for k, m in zip(keys, medians)]
        ax.bar([j + (i - 0.5) * width for j in range(len(keys))], medians, width, yerr=[low, high],
               capsize=3, label=label)
    ax.set_xticks(range(len(keys)), ["%d hosts\n%s" % k for k in keys], fontsize=8)
    ax.set_ylabel("ms a step at 1 Gb/s (median)")
    ax.set_title("Where to cut over 1 Gb/s (%s)" % table[0]["date"])
    ax.legend(fontsize=7)


def hosts_panel(ax, table):
    """W2's rows by link: a bar for each system, schedule and data plane."""
    links = list(dict.fromkeys(r["link"] for r in table))
    systems = list(dict.fromkeys((r["system"], r["schedule"], r["micro_batches"], r["transport"]) for r in table))
    width = 0.8 / len(systems)
    for i, (system, schedule, m, transport) in enumerate(systems):
        ms = []
        for link in links:
            hit = [r for r in table if r["link"] == link and (r["system"], r["schedule"], r["micro_batches"],
                                                              r["transport"]) == (system, schedule, m, transport)]
            ms.append(float(hit[0]["ms"]) if hit else float("nan"))
        ax.bar([j + (i - (len(systems) - 1) / 2) * width for j in range(len(links))], ms, width,
               label="%s %s m%s %s" % (system, schedule, m, transport))
    ax.axhline(float(table[0]["eager_ms"]), color="grey", linestyle="--", label="eager, one GPU")
    ax.set_xticks(range(len(links)), [link.replace("gbit", " Gb/s") for link in links])
    ax.set_ylabel("ms a step")
    ax.set_title("W2, GPUs as hosts (%s, %s)" % (table[0]["cards"], table[0]["date"]))
    ax.legend(fontsize=7)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    out, convnet, decoder, cut, hosts = sys.argv[1:]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.6))
    for row, (path, title) in enumerate([(convnet, "ConvNet"), (decoder, "decoder")]):
        table = rows(path)
        for col, n in enumerate([2, 4]):
            slow_links_panel(axes[row][col], table, n, title)
    cut_panel(axes[0][2], rows(cut))
    hosts_panel(axes[1][2], rows(hosts))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print("links_plot: wrote %s" % out)


if __name__ == "__main__":
    main()
