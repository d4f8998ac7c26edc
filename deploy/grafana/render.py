#!/usr/bin/env python3
"""Draws deploy/grafana/conveyor.json's panels from a Prometheus server's data,
without Grafana: each panel's queries asked over the last minutes through the
HTTP API (/api/v1/query_range) and drawn with matplotlib in the dashboard's
grid. docs/images/dashboard.png was made this way (docs/operations.md).

usage: render.py PROMETHEUS_HOST:PORT OUT.png [MINUTES]
"""
import json
import os
import sys
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conveyor.json")


def query_range(server, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"http://{server}/api/v1/query_range?{q}", timeout=30) as reply:
        body = json.load(reply)
    return body["data"]["result"] if body.get("status") == "success" else []


def legend(fmt, labels):
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    server, out = argv[1], argv[2]
    minutes = float(argv[3]) if len(argv) > 3 else 5
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    panels = dashboard["panels"]
    end = time.time()
    start = end - minutes * 60
    step = max(1, minutes * 60 / 300)
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(16, 3.2 * rows))
    fig.suptitle(f"{dashboard['title']} (deploy/grafana/conveyor.json, drawn from Prometheus at {server})")
    for ax, panel in zip(axes.flat, panels):
        ax.set_title(panel["title"], fontsize=10)
        drawn = 0
        for target in panel["targets"]:
            for series in query_range(server, target["expr"], start, end, step):
                xs = [float(t) - end for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, lw=1, label=legend(target.get("legendFormat", ""), series["metric"]))
                drawn += 1
        if drawn:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds before now", fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=80)


if __name__ == "__main__":
    main(sys.argv)
