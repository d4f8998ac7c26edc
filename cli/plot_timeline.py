#!/usr/bin/env python3
"""Draws a step timeline written by `conveyor trace` as a PNG.

usage: plot_timeline.py TRACE.json OUT.png

One row per stage; forward, backward (input gradient with zero-bubble),
weight-gradient, recompute and optimizer work as coloured bars; sends as thin
marks; what is left white is idle time. Each row is labelled with the stage's
measured idle fraction.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weight": "#55A868",
    "recompute": "#8172B3",
    "optimizer": "#7F7F7F",
    "send": "#C44E52",
}


def main(src, dst):
    with open(src) as f:
        trace = json.load(f)
    meta = trace.get("metadata", {})
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    stages = sorted({e["tid"] for e in events})
    idle = meta.get("idle_fraction", [])
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.55 * len(stages)))
    for e in events:
        cat = e["cat"]
        if cat not in COLOURS:
            continue  # receive waits show as the white gaps they are
        row = e["tid"]
        height = 0.25 if cat == "send" else 0.8
        ax.broken_barh([(e["ts"] / 1000.0, e["dur"] / 1000.0)], (row - height / 2, height),
                       facecolors=COLOURS[cat], edgecolor="white", linewidth=0.3)
        if cat in ("forward", "backward", "weight") and e["dur"] > 0:
            ax.text((e["ts"] + e["dur"] / 2) / 1000.0, row, e["name"][1:], ha="center", va="center",
                    fontsize=6, color="white", clip_on=True)
    labels = []
    for s in stages:
        label = "stage %d" % s
        if s < len(idle):
            label += "\nidle %.0f%%" % (100 * idle[s])
        labels.append(label)
    ax.set_yticks(stages)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first action")
    title = "%s step %s: %s, %s micro-batches" % (meta.get("job_id", ""), meta.get("step", ""),
                                                   meta.get("schedule", ""), meta.get("micro_batches", ""))
    if meta.get("virtual_stages", 1) > 1:
        title += ", %d chunks per stage" % meta["virtual_stages"]
    if "theoretical_idle_fraction" in meta:
        title += " (bubble in theory %.0f%%)" % (100 * meta["theoretical_idle_fraction"])
    ax.set_title(title, fontsize=10, pad=20)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    # Between the title and the bars: below them it would cover the axis label.
    ax.legend(handles, COLOURS.keys(), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(COLOURS), fontsize=8,
              frameon=False, borderaxespad=0.2)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
