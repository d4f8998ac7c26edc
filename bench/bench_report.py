"""bench.py's rows: their vs_* ratios, the table, the CSV and the seed's two plots, and the table of
`bench.py sizes`."""
import csv
import os
import re
import sys

import torch_pipelining as tp  # noqa: E402  (imports no torch at module level)
from bench_workloads import base_name, row_batch
from bench_outside import clocks_disagree


FIELDS = ["workload", "variant", "impl", "schedule", "micro_batches", "stages", "ms_per_step",
          "samples_per_second", "throughput", "unit", "vs_pytorch_1gpu", "vs_best_pytorch",
          "vs_conveyor_1dev", "vs_torch_pp_best", "gpus", "mfu", "statistic", "outside_ms_per_step", "outside_ratio", "outside_same_runs_ratio", "outside_walls", "runs_own_ms", "median_step_ms", "final_loss", "busy_fraction",
          "theoretical_idle_fraction", "peak_gib", "note"]


def ratios(rows):
    """Fill each row's vs_* columns from the rows of its workload and batch (merged CSVs of a
    batch sweep: a row at batch 480 is compared with pytorch-1gpu at 480)."""
    by_w = {}
    for r in rows:
        by_w.setdefault((r["workload"], row_batch(r)), []).append(r)
    for w, rs in by_w.items():
        ref = {base_name(r["variant"]): float(r["throughput"]) for r in rs}  # --batch: -bB
        best = max([float(r["throughput"]) for r in rs if r["impl"] == "pytorch"] or [0])
        # torch.distributed.pipelining's fastest row (any schedule, any micro-batch count) on as many GPUs
        pp_best = {}
        for r in rs:
            if r["impl"] == "pytorch" and r["schedule"] in tp.PIPELINED:
                g = str(r.get("gpus") or "")
                pp_best[g] = max(pp_best.get(g, 0), float(r["throughput"]))
        for r in rs:
            t = float(r["throughput"])
            pp = pp_best.get(str(r.get("gpus") or ""))
            r["vs_torch_pp_best"] = "%.3f" % (t / pp) if pp and r["schedule"] not in ("", "single", "best") else ""
            r["vs_pytorch_1gpu"] = "%.3f" % (t / ref["pytorch-1gpu"]) if "pytorch-1gpu" in ref else ""
            r["vs_best_pytorch"] = "%.3f" % (t / best) if best else ""
            r["vs_conveyor_1dev"] = "%.3f" % (t / ref["conveyor-1dev"]) if "conveyor-1dev" in ref else ""
    return rows


def table(rows, workload):
    rs = [r for r in rows if r["workload"] == workload]
    if not rs:
        return ""
    unit = rs[0]["unit"]
    py = [r for r in rs if r["impl"] == "pytorch"]
    best = max(py, key=lambda r: float(r["throughput"]))["variant"] if py else "-"
    x = lambda s: "%.2fx" % float(s) if s not in ("", None) else "-"
    pp = [r for r in py if r["schedule"] in tp.PIPELINED]
    pp_best = max(pp, key=lambda r: float(r["throughput"]))["variant"] if pp else "-"
    lines = ["%s (best PyTorch variant: %s; torch-pp-best: %s)" % (workload.upper(), best, pp_best), "",
             "| variant | GPUs | ms / step | %s / s | vs pytorch-1gpu | vs best PyTorch | vs torch-pp-best | "
             "vs conveyor-1dev | MFU | peak GiB a GPU | outside ms / step |" % unit,
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rs:
        outside = r.get("outside_ms_per_step") or ""
        if outside:  # the row's figure checked from outside (two run lengths)
            outside = "%.1f (%s)" % (float(outside), x(r["outside_ratio"]))
            if r.get("outside_same_runs_ratio"):
                outside = outside[:-1] + "; same run %s)" % x(r["outside_same_runs_ratio"])
            if clocks_disagree(r["outside_ratio"]):
                outside = "**%s**" % outside
        util = "%.1f%%" % (100 * float(r["mfu"])) if r.get("mfu") else "-"
        lines.append("| %s | %s | %.1f | %.0f | %s | %s | %s | %s | %s | %s | %s |" % (
            r["variant"], r.get("gpus") or "-", float(r["ms_per_step"]), float(r["throughput"]),
            x(r["vs_pytorch_1gpu"]), x(r["vs_best_pytorch"]), x(r.get("vs_torch_pp_best")),
            x(r["vs_conveyor_1dev"]), util, peak_column(r.get("peak_gib")), outside or "-"))
    return "\n".join(lines)


def peak_column(peaks):
    """The table's peak memory: the largest GPU's, and every GPU's where they differ (GiB)."""
    vals = [float(v) for v in str(peaks or "").split("/") if v]
    if not vals:
        return "-"
    top = "%.1f" % max(vals)
    return top if len(set("%.1f" % v for v in vals)) == 1 else "%s (%s)" % (top, "/".join("%.1f" % v for v in vals))


def conveyor_peaks(r):
    """A Conveyor run's peak device memory of each stage server (GiB, '/'-joined), from its JSON."""
    peaks = [s.get("memory", {}).get("device_peak_bytes", 0) for s in r.get("stages", [])]
    return "/".join("%.2f" % (b / 2 ** 30) for b in peaks if b)


def write_csv(path, rows):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        out.writeheader()
        out.writerows(rows)
    os.replace(tmp, path)


def read_csv(path):
    with open(path, newline="") as f:
        return [dict(r) for r in csv.DictReader(f)]


def plot(out_dir, workload, rows):
    rows = [r for r in rows if r["workload"] == workload]
    if not rows:
        return []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plots: matplotlib is not installed for %s" % sys.executable, file=sys.stderr)
        return []
    unit = rows[0]["unit"]
    colors = {"pytorch": "#DD8452", "conveyor": "#4C72B0"}
    files = []

    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4.5))
    ax.bar(range(len(rows)), [float(r["throughput"]) for r in rows],
           color=[colors.get(r["impl"], "gray") for r in rows])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["variant"] for r in rows], rotation=50, ha="right", fontsize=8)
    base = [r for r in rows if base_name(r["variant"]) == "pytorch-1gpu"]
    if len(base) == 1:  # one batch
        ax.axhline(float(base[0]["throughput"]), color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel("%s / s" % unit)
    ax.set_title("%s: throughput by variant (orange: PyTorch, blue: Conveyor)" % workload.upper())
    fig.tight_layout()
    path = os.path.join(out_dir, "bench-%s-variants.png" % workload)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    files.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    batches = sorted({row_batch(r) for r in rows})
    for r in rows:
        m, name = int(r["micro_batches"]), base_name(r["variant"])
        if r["impl"] == "pytorch" and r["schedule"] in tp.PIPELINED:
            label = "torch.distributed.pipelining %s" % r["schedule"]
        elif r["impl"] == "pytorch" and r["schedule"] == "tutorial":
            label = "PyTorch tutorial's pipelined class"
        elif r["impl"] == "conveyor" and r["schedule"] not in ("", "naive") and name != "conveyor-1stage-graphs":
            label = "Conveyor %s%s" % (r["schedule"], ", CUDA graphs" if name.endswith("-graphs") else "")
        else:
            continue
        if len(batches) > 1:  # merged CSVs of a batch sweep: a curve per batch
            label += ", batch %d" % row_batch(r)
        series.setdefault((r["impl"], label), []).append((m, float(r["ms_per_step"])))
    ms = set()
    for (impl, label), pts in sorted(series.items()):
        pts.sort()
        ms.update(p[0] for p in pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if impl == "conveyor" else "s",
                linestyle="-" if impl == "conveyor" else "--", label=label)
    for name, style in (("pytorch-1gpu", ":"), ("torch-naive-mp", "-."), ("conveyor-1dev", ":"),
                        ("naive-mp", "-.")):
        for ref in [r for r in rows if base_name(r["variant"]) == name]:  # one per batch
            ax.axhline(float(ref["ms_per_step"]), color=colors[ref["impl"]], linestyle=style, linewidth=1.2,
                       label=ref["variant"])
    if ms:
        ax.set_xscale("log", base=2)
        ticks = sorted(ms)
        ax.set_xticks(ticks)
        # the split size under each count, where the rows share one batch
        ax.set_xticklabels(["%d\n(%s)" % (m, batches[0] // m) if len(batches) == 1 else str(m) for m in ticks])
        ax.minorticks_off()
    ax.set_xlabel("micro-batches per step (split size)")
    ax.set_ylabel("ms / step")
    ax.set_title("%s: the split-size trade-off" % workload.upper())
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "bench-%s-split.png" % workload)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    files.append(path)
    return files


SIZE_COLUMNS = ["pytorch-1gpu", "pytorch-1gpu-cl", "pytorch-1gpu-graph", "pytorch-1gpu-compile", "conveyor-1dev",
                "conveyor-1dev-loop", "conveyor-1dev-graphs", "conveyor-1dev-eager", "conveyor-1dev-unfused",
                "conveyor-1dev-nchw", "conveyor-1stage-graphs"]


def sizes_table(rows):
    """ms per step of every single-device variant by (workload, batch), and the best of each side."""
    lines = ["| workload | batch | " + " | ".join(SIZE_COLUMNS) + " | best PyTorch | best Conveyor | Conveyor / PyTorch |",
             "| --- | ---: | " + " | ".join("---:" for _ in SIZE_COLUMNS) + " | --- | --- | ---: |"]
    groups = {}
    for r in rows:
        m = re.match(r"^(.*)-b(\d+)$", r["variant"])
        if m:
            groups.setdefault((r["workload"], int(m.group(2))), {})[m.group(1)] = r
    for (w, b), by in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        ms = {n: float(r["ms_per_step"]) for n, r in by.items()}
        best = lambda impl: min(((v, n) for n, v in ms.items() if by[n]["impl"] == impl), default=None)
        py, cv = best("pytorch"), best("conveyor")
        lines.append("| %s | %d | %s | %s | %s | %s |" % (
            w.upper(), b, " | ".join("%.1f" % ms[n] if n in ms else "-" for n in SIZE_COLUMNS),
            py[1] if py else "-", cv[1] if cv else "-", "%.2f" % (cv[0] / py[0]) if py and cv else "-"))
    return "\n".join(lines)
