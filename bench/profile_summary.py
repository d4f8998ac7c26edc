#!/usr/bin/env python3
"""Tabulates operator profiles (Chrome traces): Conveyor's (profile_step,
common/op_profile.cpp) and PyTorch's (torch.profiler's export_chrome_trace),
which use the same event categories.

For each trace: device busy time, then ms per operator family (convolution,
batch norm, matmul/GEMM, attention, elementwise, copies and format
conversions, optimizer, memcpy/memset, other), side by side for two or more
traces, with each family's difference from the first trace; then the
costliest kernels (or, with no device events, host operators) by total time.
Host operators nest (aten::conv2d holds aten::convolution): a CPU trace's
families count a nested operator's time once per level.
Given two traces, the kernel table is side by side by name, largest
difference first: where one run spends the time the other does not.

--gaps N lists, for each trace, the device's idle time (the span from its
first kernel to its last, less the time some kernel, copy or memset ran) and
its N longest idle gaps, each with what the host was doing meanwhile (the
outermost host operators and CUDA runtime calls that overlap it): where the
device waits for the host.

usage: bench/profile_summary.py A.json [B.json ...] [--top 25] [--host] [--families-only] [--gaps N]
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


# Operator families, first match wins (kernel names of cuDNN, cuBLAS/CUTLASS,
# ATen and flash attention; host operator names for a CPU trace).
FAMILIES = [
    ("memcpy/memset", ("memcpy", "memset")),
    ("copies/format conversions", ("nchwtonhwc", "nhwctonchw", "transpose", "permute", "copy_", "copykernel",
                                   "catarray", "cat_", "aten::copy", "aten::contiguous", "aten::clone", "to_copy",
                                   "direct_copy", "im2col", "col2im", "convert_")),
    ("optimizer", ("multi_tensor", "fused_sgd", "fused_adam", "sgd", "adam", "foreach", "optimizer")),
    ("attention", ("flash", "fmha", "attention", "softmax", "sdpa", "efficient_attention")),
    ("batchnorm", ("batch_norm", "batchnorm", "bn_fw", "bn_bw", "bn_", "welford", "native_batch_norm")),
    ("layernorm", ("layer_norm", "layernorm")),
    ("conv", ("conv", "cudnn", "xmma_fprop", "xmma_dgrad", "xmma_wgrad", "implicit_convolve", "winograd",
              "fprop", "dgrad", "wgrad", "mkldnn")),
    ("matmul/gemm", ("gemm", "cutlass", "cublas", "matmul", "aten::mm", "aten::addmm", "aten::bmm", "linear",
                     "splitkreduce", "gemv", "nvjet")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce_kernel", "relu", "gelu", "add", "mul",
                     "threshold", "max_pool", "avg_pool", "pool", "mse", "loss", "fill", "sum", "mean", "div",
                     "sub", "where", "embedding", "indexing", "index", "scatter", "gather", "dropout")),
]


def gaps(path, n):
    """The device's idle time and its n longest gaps, with the host's work during each."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    dev = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events if e.get("cat") in DEVICE)
    if not dev:
        return "%s: no device events" % path
    host = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")]
    idle, found, end = 0.0, [], dev[0][1]
    for start, stop in dev[1:]:
        if start > end:
            idle += start - end
            found.append((start - end, end, start))
        end = max(end, stop)
    span = end - dev[0][0]
    lines = ["%s: device span %.2f ms, idle %.2f ms (%.0f%%) in %d gaps" % (
        path, span / 1e3, idle / 1e3, 100 * idle / span if span else 0, len(found))]
    for g, lo, hi in sorted(found, reverse=True)[:n]:
        during = [e for e in host if float(e["ts"]) < hi and float(e["ts"]) + float(e.get("dur", 0)) > lo]
        # outermost: not inside another event of the list
        outer = [e for e in during if not any(o is not e and float(o["ts"]) <= float(e["ts"]) and
                                              float(o["ts"]) + float(o.get("dur", 0)) >= float(e["ts"]) + float(e.get("dur", 0))
                                              for o in during)]
        what = ", ".join("%s %.0f us" % (short(e["name"], 40), float(e.get("dur", 0))) for e in outer[:6])
        lines.append("  %.0f us at +%.2f ms: %s" % (g, (lo - dev[0][0]) / 1e3, what or "(no host event: the host between calls)"))
    return "\n".join(lines)


def family(name):
    n = name.lower()
    for fam, keys in FAMILIES:
        if any(k in n for k in keys):
            return fam
    return "other"


def families(totals):
    out = collections.Counter()
    for name, us in totals.items():
        out[family(name)] += us
    return out


def family_table(paths, runs):
    """ms per family, one column per trace, and each's difference from the first."""
    fams = [f for f, _ in FAMILIES] + ["other"]
    per = [families(t) for t, _, _ in runs]
    head = " | ".join("%s ms" % chr(ord("A") + i) for i in range(len(paths)))  # the traces, as listed above
    lines = ["| family | %s |%s" % (head, "".join(" %s - A |" % chr(ord("A") + i) for i in range(1, len(runs)))),
             "| --- |" + " ---: |" * (len(runs) + len(runs) - 1)]
    for f in fams + ["total"]:
        vals = [sum(p.values()) if f == "total" else p[f] for p in per]
        if f != "total" and not any(vals):
            continue
        lines.append("| %s | %s |%s" % (f, " | ".join("%.2f" % (v / 1e3) for v in vals),
                                       "".join(" %+.2f |" % ((v - vals[0]) / 1e3) for v in vals[1:])))
    return "\n".join(lines)


def short(name, width=70):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--host", action="store_true", help="host operators instead of device kernels")
    p.add_argument("--families-only", action="store_true", help="only the table of operator families")
    p.add_argument("--gaps", type=int, default=0, help="the device's N longest idle gaps and the host's work in them")
    a = p.parse_args()
    if a.gaps:
        for t in a.traces:
            print(gaps(t, a.gaps) + "\n")
    runs = [load(t, a.host) for t in a.traces]
    for i, (path, (totals, counts, launches)) in enumerate(zip(a.traces, runs)):
        print("%s: %s: %.1f ms in %d events (%d kinds)%s" % (
            chr(ord("A") + i), path, sum(totals.values()) / 1e3, sum(counts.values()), len(totals),
            ", %d kernel launches seen from the host" % launches if launches else ""))
    print("\nms per operator family\n\n" + family_table(a.traces, runs))
    if a.families_only:
        return 0
    runs = runs[:2]
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
