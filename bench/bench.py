#!/usr/bin/env python3
"""Conveyor's pipeline benchmark: the seed tutorial's comparison, grown up.

For one workload of ../shared/BENCHMARKS.md (w1: ResNet50 in two stages, the
seed experiment; w2: a 1.34 B GPT decoder in bf16) it runs, one after the other
on this machine:

  pytorch-1gpu     PyTorch itself, the whole model on one GPU (python3, when
                   torch with CUDA can be imported; w1 also needs torchvision)
  conveyor-1dev    `conveyor train --reference`: Conveyor's single device
  naive-mp         2 stage servers, one micro-batch per step (plain model parallel)
  <schedule>-m<M>  2 stage servers with each schedule over a sweep of micro-batch counts

It prints a table, writes bench-<workload>.csv and, where matplotlib imports,
the seed's two pictures: a bar chart of the variants and the micro-batch
trade-off curve. Throughput is measured after the first steps (warm-up).

usage: bench/bench.py w2 [--bin build-gpu/bin] [--out DIR] [--steps 10]
                         [--micro-batches 4,8,16] [--schedules gpipe,1f1b,zero-bubble]
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOBS = {"w1": "examples/resnet50-w1.yaml", "w2": "examples/gpt-w2.yaml"}
# Units per sample for the throughput column: images, or tokens.
UNITS = {"w1": ("images", 1), "w2": ("tokens", 1024)}


def job_text(workload, steps, schedule=None, micro_batches=None):
    text = open(os.path.join(ROOT, JOBS[workload])).read()
    text = re.sub(r"(?m)^steps: .*$", "steps: %d" % steps, text)
    if schedule:
        text = re.sub(r"(?m)^schedule: .*$", "schedule: %s" % schedule, text)
    if micro_batches:
        text = re.sub(r"(?m)^(micro_batches|split_size): .*$", "micro_batches: %d" % micro_batches, text)
    return text


def batch_size(workload):
    return int(re.search(r"(?m)^batch_size: (\d+)", open(os.path.join(ROOT, JOBS[workload])).read()).group(1))


def run_conveyor(args, workload, name, extra_args, **job):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(job_text(workload, args.steps, **job))
        path = f.name
    cmd = [os.path.join(args.bin, "conveyor")] + extra_args(path) + ["--json"]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    log = os.path.join(args.out, "%s-%s.log" % (workload, name))
    with open(log, "w") as f:
        f.write(proc.stderr)
    os.unlink(path)
    if proc.returncode != 0:
        print("  %s failed (exit %d), see %s" % (name, proc.returncode, log), file=sys.stderr)
        return None
    result = json.loads(proc.stdout)
    result["wall_seconds"] = time.time() - started
    return result


def pytorch_single_gpu(args, workload):
    """The workload in PyTorch itself, in a child python3 (torch may be absent)."""
    code = PYTORCH_W1 if workload == "w1" else PYTORCH_W2
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(args.steps)], capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        print("  pytorch-1gpu skipped: %s" % (proc.stderr.strip().splitlines() or ["?"])[-1], file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


PYTORCH_W2 = r'''
import json, sys, time, torch, torch.nn as nn, torch.nn.functional as F
steps = int(sys.argv[1]); dev = "cuda:0"
V, W, L, H, M, T, B = 32000, 2048, 24, 16, 8192, 1024, 32
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.n1 = nn.LayerNorm(W); s.qkv = nn.Linear(W, 3 * W); s.proj = nn.Linear(W, W)
        s.n2 = nn.LayerNorm(W); s.fc1 = nn.Linear(W, M); s.fc2 = nn.Linear(M, W)
    def forward(s, x):
        b, t, w = x.shape
        q, k, v = s.qkv(s.n1(x)).view(b, t, 3, H, w // H).permute(2, 0, 3, 1, 4)
        x = x + s.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w))
        return x + s.fc2(F.gelu(s.fc1(s.n2(x))))
class GPT(nn.Module):
    def __init__(s):
        super().__init__(); s.tok = nn.Embedding(V, W); s.pos = nn.Embedding(T, W)
        s.blocks = nn.Sequential(*[Block() for _ in range(L)]); s.norm = nn.LayerNorm(W); s.out = nn.Linear(W, V)
    def forward(s, x):
        return s.out(s.norm(s.blocks(s.tok(x) + s.pos(torch.arange(x.shape[1], device=x.device)))))
model = GPT().to(dev, torch.bfloat16); opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randint(V, (B, T), device=dev); y = torch.randint(V, (B, T), device=dev)
times = []
for i in range(steps):
    torch.cuda.synchronize(); t0 = time.time()
    opt.zero_grad(); loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()); loss.backward(); opt.step()
    torch.cuda.synchronize(); times.append(time.time() - t0)
steady = times[2:] or times
print(json.dumps({"steady_samples_per_second": B * len(steady) / sum(steady)}))
'''

PYTORCH_W1 = r'''
import json, sys, time, torch, torch.nn.functional as F, torchvision
steps = int(sys.argv[1]); dev = "cuda:0"; B = 120
model = torchvision.models.resnet50(num_classes=1000).to(dev); opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(B, 3, 128, 128, device=dev); y = F.one_hot(torch.randint(1000, (B,), device=dev), 1000).float()
times = []
for i in range(steps):
    torch.cuda.synchronize(); t0 = time.time()
    opt.zero_grad(); F.mse_loss(model(x), y).backward(); opt.step()
    torch.cuda.synchronize(); times.append(time.time() - t0)
steady = times[2:] or times
print(json.dumps({"steady_samples_per_second": B * len(steady) / sum(steady)}))
'''


def plot(args, workload, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plots: matplotlib is not installed for %s" % sys.executable, file=sys.stderr)
        return
    unit, per_sample = UNITS[workload]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4))
    ax.bar([r["variant"] for r in rows], [r["throughput"] for r in rows], color="#4C72B0")
    ax.set_ylabel("%s / s" % unit)
    ax.set_title("%s: throughput by variant" % workload.upper())
    plt.setp(ax.get_xticklabels(), rotation=40, ha="right")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench-%s-variants.png" % workload), dpi=120)
    fig, ax = plt.subplots(figsize=(6, 4))
    for schedule in args.schedules:
        pts = sorted((r["micro_batches"], r["ms_per_step"]) for r in rows if r["schedule"] == schedule)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=schedule)
    base = [r for r in rows if r["variant"] == "conveyor-1dev"]
    if base:
        ax.axhline(base[0]["ms_per_step"], color="gray", linestyle="--", label="single device")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches per step (split size = batch / micro-batches)")
    ax.set_ylabel("ms / step")
    ax.set_title("%s: the micro-batch trade-off" % workload.upper())
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench-%s-split.png" % workload), dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=sorted(JOBS))
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--out", default=".")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--micro-batches", default="4,8,16")
    p.add_argument("--schedules", default="gpipe,1f1b,zero-bubble")
    p.add_argument("--device", default="cuda:0", help="device of the single-device variant")
    p.add_argument("--no-pytorch", action="store_true")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    args.schedules = args.schedules.split(",")
    os.makedirs(args.out, exist_ok=True)
    w = args.workload
    unit, per_sample = UNITS[w]
    rows = []

    def add(variant, schedule, m, sps):
        if sps:
            rows.append({"variant": variant, "schedule": schedule, "micro_batches": m,
                         "samples_per_second": sps, "throughput": sps * per_sample,
                         "ms_per_step": 1000.0 * batch_size(w) / sps})
            print("  %-22s %10.1f %s/s" % (variant, sps * per_sample, unit), flush=True)

    if not args.no_pytorch:
        r = pytorch_single_gpu(args, w)
        add("pytorch-1gpu", "", 1, r and r["steady_samples_per_second"])
    r = run_conveyor(args, w, "conveyor-1dev", lambda job: ["train", job, "--reference", "--device", args.device])
    add("conveyor-1dev", "", 1, r and r["steady_samples_per_second"])
    r = run_conveyor(args, w, "naive-mp", lambda job: ["local", job], schedule="gpipe", micro_batches=1)
    add("naive-mp", "naive", 1, r and r["steady_samples_per_second"])
    for schedule in args.schedules:
        for m in [int(x) for x in args.micro_batches.split(",")]:
            name = "%s-m%d" % (schedule, m)
            r = run_conveyor(args, w, name, lambda job: ["local", job], schedule=schedule, micro_batches=m)
            add(name, schedule, m, r and r["steady_samples_per_second"])

    ref = {r["variant"]: r["throughput"] for r in rows}
    print("\n| variant | ms / step | %s / s | vs conveyor-1dev | vs pytorch-1gpu |" % unit)
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        vs = lambda k: "%.2fx" % (r["throughput"] / ref[k]) if k in ref else "-"
        print("| %s | %.1f | %.0f | %s | %s |" % (r["variant"], r["ms_per_step"], r["throughput"],
                                                  vs("conveyor-1dev"), vs("pytorch-1gpu")))
    with open(os.path.join(args.out, "bench-%s.csv" % w), "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["variant"])
        out.writeheader()
        out.writerows(rows)
    plot(args, w, rows)


if __name__ == "__main__":
    main()
