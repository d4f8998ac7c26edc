#!/usr/bin/env python3
"""Replicas x stages on the CPU: one job as R x P = 1 x 2, 2 x 1 and 2 x 2.

Runs the same job (an MLP, the same global batch, micro-batches and steps)
through `conveyor local` as 1 replica of 2 stages, 2 replicas of 1 stage and 2
replicas of 2 stages, and prints each run's steady time per step and, from
the last step's timeline (`--trace`), the share of the step that each stage
spent in the all-reduce of its gradients (the ALL_REDUCE spans) and how much
of it was waiting. On a machine with fewer cores than R x P stage processes
the figures show the overhead of the replicas, not a speed-up.

usage: bench/dp_cpu.py [--bin build/bin] [--out DIR] [--steps 40] [--repeat 2] [--bucket-mb 25]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

JOB = """name: dp-{r}x{p}
model: {{name: mlp, input_dim: 256, hidden: [1024, 1024, 1024, 256]}}
partition: {{stages: {p}}}
replicas: {r}
data: {{name: synthetic, train_samples: 65536, test_samples: 0}}
batch_size: 128
micro_batches: 4
schedule: 1f1b
optimizer: {{name: adamw, lr: 0.001}}
bucket_cap_mb: {bucket}
steps: {steps}
"""


def run(args, r, p, rep):
    tag = "%dx%d-%d" % (r, p, rep)
    path = os.path.join(args.out, tag + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(r=r, p=p, steps=args.steps, bucket=args.bucket_mb))
    prefix = os.path.join(args.out, tag + "-trace")
    cmd = [os.path.join(args.bin, "conveyor"), "local", path, "--json", "--device", "cpu", "--trace", prefix]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
        return {"grid": "%d x %d" % (r, p), "error": "exit %d" % proc.returncode}
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    ms = 1000.0 * 128 / summary["steady_samples_per_second"]
    trace = json.load(open(prefix + ".json"))
    step_us = trace["metadata"]["step_us"]
    # Per stage: the union of its buckets' all-reduce spans, and the part of it
    # after the stage's last backward (or weight) pass ended: what the step
    # waited for, the rest overlapping the backward work.
    spans, last_backward = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "all-reduce":
            spans.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        elif e.get("cat") in ("backward", "weight"):
            last_backward[e["tid"]] = max(last_backward.get(e["tid"], 0), e["ts"] + e["dur"])
    union, exposed = {}, {}
    for tid, ss in spans.items():
        ss.sort()
        total, cur_a, cur_b = 0, None, None
        for a, b in ss:
            if cur_b is None or a > cur_b:
                total += (cur_b - cur_a) if cur_b is not None else 0
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        total += (cur_b - cur_a) if cur_b is not None else 0
        union[tid] = total
        exposed[tid] = max(0, max(b for _, b in ss) - max(last_backward.get(tid, 0), min(a for a, _ in ss)))
    share = max(union.values()) / step_us if union else 0.0
    exposed_share = max(exposed.values()) / step_us if exposed else 0.0
    return {"grid": "%d x %d" % (r, p), "ms_per_step": round(ms, 1), "all_reduce_share": round(share, 3),
            "exposed_share": round(exposed_share, 3), "buckets": max((len(v) for v in spans.values()), default=0),
            "last_step_us": step_us}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "build", "bin"))
    ap.add_argument("--out", default="dp-cpu")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each grid, alternated; the table shows medians")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--bucket-mb", type=float, default=25, help="the job's bucket_cap_mb (DDP's default 25)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    grids = [(1, 2), (2, 1), (2, 2)]
    rows = {g: [] for g in grids}
    for rep in range(args.repeat):
        for r, p in grids:
            rows[(r, p)].append(run(args, r, p, rep))
    print("bucket_cap_mb %g" % args.bucket_mb)
    print("| replicas x stages | ms / step (median of %d) | buckets per stage | all-reduce share of the last step "
          "(largest stage) | of it after the last backward |" % args.repeat)
    print("| --- | ---: | ---: | ---: | ---: |")
    out = []
    fields = ["grid", "ms_per_step", "buckets", "all_reduce_share", "exposed_share"]
    for g in grids:
        ok = [x for x in rows[g] if "error" not in x]
        if not ok:
            print("| %d x %d | %s | | | |" % (g[0], g[1], rows[g][0]["error"]))
            continue
        row = {"grid": "%d x %d" % g}
        for k in fields[1:]:
            row[k] = statistics.median(x[k] for x in ok)
        out.append(row)
        print("| %s | %.1f | %d | %.1f%% | %.1f%% |" % (row["grid"], row["ms_per_step"], row["buckets"],
                                                     100 * row["all_reduce_share"], 100 * row["exposed_share"]))
    with open(os.path.join(args.out, "dp-cpu.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
