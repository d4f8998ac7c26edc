#!/usr/bin/env python3
"""Draws a step timeline written by `conveyor trace` as a PNG.

usage: plot_timeline.py TRACE.json OUT.png [--layout LAYOUT.json]

One row per stage; forward, backward (input gradient with zero-bubble),
weight-gradient, recompute and optimizer work as coloured bars; sends as thin
marks; what is left white is idle time. Each row is labelled with the stage's
measured idle fraction. The legend lists only the kinds the step has.

Every bar is drawn at least MIN_BLOCK_PX pixels wide, so a send of a few
microseconds next to forwards of milliseconds still shows. A bar's
micro-batch label is drawn only where its measured extent fits inside the bar
and clear of every other label.

--layout writes what was drawn as JSON, in pixels of the PNG (origin at its
top left, y downwards): the legend's entries, each bar (stage row, kind, name,
x0/x1/y0/y1), each label (text, the index of its bar, its box) and the mapping
from trace microseconds to x pixels.
"""
import argparse
import json
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(3)  # this python3 has none: cli/plot.cpp tries the next

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weight": "#55A868",
    "recompute": "#8172B3",
    "optimizer": "#7F7F7F",
    "send": "#C44E52",
    "all-reduce": "#937860",
}
LABELLED = ("forward", "backward", "weight")
DPI = 130
MIN_BLOCK_PX = 2.0  # the narrowest a bar is drawn
EDGE_MIN_PX = 5.0  # narrower bars get no white edge, which would cover them
LABEL_PAD_PX = 1.0  # room kept between a label and its bar's ends


def overlaps(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def main(src, dst, layout_path=None):
    with open(src) as f:
        trace = json.load(f)
    meta = trace.get("metadata", {})
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    stages = sorted({e["tid"] for e in events})
    # Receive waits show as the white gaps they are.
    drawn = [e for e in events if e["cat"] in COLOURS]
    kinds = [k for k in COLOURS if any(e["cat"] == k for e in drawn)]
    idle = meta.get("idle_fraction", [])

    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.55 * len(stages)), dpi=DPI)
    labels = []
    for s in stages:
        label = "stage %d" % s
        if s < len(idle):
            label += "\nidle %.0f%%" % (100 * idle[s])
        labels.append(label)
    ax.set_yticks(stages)
    ax.set_yticklabels(labels, fontsize=8)
    # The limits autoscaling would give the bars (5% margins), fixed before the
    # layout so that pixels per millisecond are known when the bars are drawn.
    if events:
        lo = min(e["ts"] for e in events) / 1000.0
        hi = max(e["ts"] + e["dur"] for e in events) / 1000.0
    else:
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + 1.0
    ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    if stages:
        top, bottom = stages[0] - 0.4, stages[-1] + 0.4
        ax.set_ylim(bottom + 0.05 * (bottom - top), top - 0.05 * (bottom - top))  # stage 0 on top
    else:
        ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first action")
    title = "%s step %s: %s, %s micro-batches" % (meta.get("job_id", ""), meta.get("step", ""),
                                                   meta.get("schedule", ""), meta.get("micro_batches", ""))
    if meta.get("virtual_stages", 1) > 1:
        title += ", %d chunks per stage" % meta["virtual_stages"]
    if "theoretical_idle_fraction" in meta:
        title += " (bubble in theory %.0f%%)" % (100 * meta["theoretical_idle_fraction"])
    ax.set_title(title, fontsize=10, pad=20)
    legend = None
    if kinds:
        handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds]
        # Between the title and the bars: below them it would cover the axis label.
        legend = ax.legend(handles, kinds, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(kinds),
                           fontsize=8, frameon=False, borderaxespad=0.2)
    fig.tight_layout()

    # Pixels from here on: the axes no longer move.
    px0, px1 = ax.transData.transform([(0.0, 0.0), (1.0, 0.0)])[:, 0]
    px_per_ms = px1 - px0
    min_ms = MIN_BLOCK_PX / px_per_ms
    blocks = []  # (event, x ms, width ms, y, height)
    for e in drawn:
        cat = e["cat"]
        height = 0.25 if cat in ("send", "all-reduce") else 0.8
        # A bucket's all-reduce runs beside the backward work: a thin bar
        # along the row's lower edge.
        y = e["tid"] + 0.4 - height if cat == "all-reduce" else e["tid"] - height / 2
        x, width = e["ts"] / 1000.0, max(e["dur"] / 1000.0, min_ms)
        thin = width * px_per_ms < EDGE_MIN_PX
        # Sends and all-reduces above the work they may overlap, never hidden under it.
        ax.broken_barh([(x, width)], (y, height), facecolors=COLOURS[cat],
                       edgecolor="none" if thin else "white", linewidth=0 if thin else 0.3,
                       zorder=2 if cat in ("send", "all-reduce") else 1)
        blocks.append((e, x, width, y, height))

    renderer = fig.canvas.get_renderer()
    placed = []  # (text artist, block index, box)
    order = sorted((i for i, b in enumerate(blocks) if b[0]["cat"] in LABELLED and b[0]["dur"] > 0),
                   key=lambda i: -blocks[i][2])  # the widest bars first: they show their labels best
    for i in order:
        e, x, width, y, height = blocks[i]
        text = ax.text(x + width / 2, e["tid"], e["name"][1:], ha="center", va="center", fontsize=6,
                       color="white", clip_on=True, zorder=3)
        box = text.get_window_extent(renderer)
        bx0, by0 = ax.transData.transform((x, y))
        bx1, by1 = ax.transData.transform((x + width, y + height))
        fits = (box.x0 >= min(bx0, bx1) + LABEL_PAD_PX and box.x1 <= max(bx0, bx1) - LABEL_PAD_PX
                and box.y0 >= min(by0, by1) and box.y1 <= max(by0, by1))
        if fits and not any(overlaps(box, other) for _, _, other in placed):
            placed.append((text, i, box))
        else:
            text.remove()

    fig.savefig(dst, dpi=DPI)
    if layout_path:
        write_layout(layout_path, fig, ax, legend, blocks, placed, px0, px_per_ms)


def write_layout(path, fig, ax, legend, blocks, placed, px0, px_per_ms):
    """What the PNG shows, in its pixels (origin top left), measured from the artists after drawing."""
    renderer = fig.canvas.get_renderer()
    height = fig.bbox.height

    def box(x0, y0, x1, y1):  # display coordinates (origin bottom left) to the PNG's
        return {"x0": min(x0, x1), "x1": max(x0, x1), "y0": height - max(y0, y1), "y1": height - min(y0, y1)}

    out_blocks = []
    for e, x, width, y, h in blocks:
        (x0, y0), (x1, y1) = ax.transData.transform([(x, y), (x + width, y + h)])
        out_blocks.append(dict(stage=e["tid"], kind=e["cat"], name=e["name"], ts_us=e["ts"], dur_us=e["dur"],
                               **box(x0, y0, x1, y1)))
    out_labels = []
    for text, i, _ in placed:
        b = text.get_window_extent(renderer)
        out_labels.append(dict(text=text.get_text(), block=i, **box(b.x0, b.y0, b.x1, b.y1)))
    a = ax.get_window_extent(renderer)
    layout = {
        "figure": {"width": fig.bbox.width, "height": height, "dpi": DPI},
        "axes": box(a.x0, a.y0, a.x1, a.y1),
        "x_px_at_0_us": px0,
        "x_px_per_us": px_per_ms / 1000.0,
        "min_block_px": MIN_BLOCK_PX,
        "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
        "blocks": out_blocks,
        "labels": out_labels,
    }
    with open(path, "w") as f:
        json.dump(layout, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(usage="%(prog)s TRACE.json OUT.png [--layout LAYOUT.json]")
    parser.add_argument("trace")
    parser.add_argument("png")
    parser.add_argument("--layout", help="also write what was drawn, in the PNG's pixels, as JSON")
    args = parser.parse_args()
    main(args.trace, args.png, args.layout)
