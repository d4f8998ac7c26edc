#!/usr/bin/env python3
"""bf16-mixed on W2's decoder: Conveyor against torch.autocast, loss curve and step time.

Builds W2's 1.34 B-parameter decoder (bench/torchscript_w2.py's model) with fp32
parameters, scripts it, writes a file of random uint16 token ids, and trains it
for --steps steps on one device, one after the other:

  pytorch-autocast   a plain PyTorch loop: fp32 parameters (the master weights),
                     forward under torch.autocast(bfloat16), the loss in fp32,
                     torch.optim.SGD
  conveyor-bf16-mixed  `conveyor local` (one stage server) of the scripted module with
                     `precision: bf16-mixed` (the same weights and batches)
  conveyor-bf16      the same with `precision: bf16` (pure bf16 parameters; a
                     different arithmetic: its curve is shown, not compared;
                     --bf16-steps steps, 12 by default, enough for its time)

Prints a table (ms per step after the warm-up, peak device memory, final loss,
the largest loss difference from pytorch-autocast over the steps) and writes
mixed-w2.csv (one row per variant) and mixed-w2-curves.csv (one row per step).

The curves cannot agree exactly: bf16 matmuls accumulate in different orders
in LibTorch's and PyTorch's kernels choices (cuBLAS picks by shape and
workspace), and those differences grow over steps as SGD follows them.

usage: bench/mixed_w2.py [--bin build/bin] [--out DIR] [--steps 50] [--bf16-steps 12] [--blocks 24]
                         [--device cuda:0] [--only VARIANTS] [--tiny]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torchscript_w2  # noqa: E402
from torchscript_w2 import BATCH, T, V, build, job  # noqa: E402

LR = 1e-3
WARMUP = 3


def run_autocast(args, model, tokens):
    import torch
    import torch.nn.functional as F
    dev = torch.device(args.device)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = torch.from_numpy(tokens.astype("int64"))
    losses, times = [], []
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    for step in range(args.steps):
        # Sample i is tokens[i*T : i*T+T], its target one token later (docs/models.md).
        rows = [data[i * T:i * T + T + 1] for i in range(step * BATCH, (step + 1) * BATCH)]
        seq = torch.stack(rows).to(dev)
        x, y = seq[:, :-1], seq[:, 1:]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        # Micro-batches as Conveyor splits them, each loss weighted by its share.
        for xm, ym in zip(x.tensor_split(args.micro_batches), y.tensor_split(args.micro_batches)):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = model(xm)
            loss = F.cross_entropy(logits.float().flatten(0, 1), ym.flatten()) * (xm.size(0) / BATCH)
            loss.backward()
            total += float(loss)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(total)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
    model.to("cpu")
    del opt
    if cuda:
        torch.cuda.empty_cache()
    return {"variant": "pytorch-autocast", "ms_per_step": round(1000 * statistics.median(times[WARMUP:]), 1),
            "peak_gib": round(peak / 2**30, 2) if peak else None, "final_loss": round(losses[-1], 4)}, losses


def memory_of(summary):
    """The largest stage's device peak (GiB) and its memory report, from the summary."""
    best, parts = None, None
    for stage in summary.get("stages") or []:
        mem = stage.get("memory") or {}
        if mem.get("device_peak_bytes", 0) > (best or 0):
            best = mem["device_peak_bytes"]
            parts = {k.replace("_bytes", ""): round(v / 2**30, 2) for k, v in mem.items()}
    return (round(best / 2**30, 2) if best else None), parts


def run_conveyor(args, name, job_path):
    # One stage server (`conveyor local`), whose summary reports its memory.
    cmd = [os.path.join(args.bin, "conveyor"), "local", job_path, "--device", "cuda" if "cuda" in args.device else "cpu",
           "--json"]
    log = os.path.join(args.out, name + ".log")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    open(log, "w").write(proc.stderr)
    if proc.returncode != 0:
        return {"variant": name, "error": "exit %d, see %s" % (proc.returncode, log)}, []
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    json.dump(summary, open(os.path.join(args.out, name + ".json"), "w"), indent=1)
    sps = summary["steady_samples_per_second"]
    losses = summary.get("losses") or []
    peak, parts = memory_of(summary)
    if parts:
        print("%s: memory (GiB) %s" % (name, parts), file=sys.stderr)
    return {"variant": name, "ms_per_step": round(1000.0 * BATCH / sps, 1), "peak_gib": peak,
            "final_loss": round(losses[-1], 4) if losses else None}, losses


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "build", "bin"))
    p.add_argument("--out", default="mixed-w2")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--micro-batches", type=int, default=2,
                   help="the batch in this many micro-batches, gradients accumulated (fp32 W2 at 32 x 1024 "
                        "tokens in one does not fit 80 GB)")
    p.add_argument("--schedule", default="1f1b",
                   help="Conveyor's schedule: 1f1b runs each micro-batch's backward right after its forward, "
                        "as the PyTorch loop does, so one micro-batch's activations are held at a time")
    p.add_argument("--bf16-steps", type=int, default=12, help="steps of the pure-bf16 run")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--timeout", type=int, default=400)
    p.add_argument("--tiny", action="store_true",
                   help="a model and batch a thousand times smaller, to check the script on a CPU")
    p.add_argument("--only", default="pytorch-autocast,conveyor-bf16-mixed,conveyor-bf16",
                   help="comma-separated variants to run")
    args = p.parse_args()
    if args.tiny:
        global BATCH, T, V
        BATCH, T, V = 4, 16, 64
        for k, v in dict(BATCH=BATCH, T=T, V=V, W=32, H=2, M=64).items():
            setattr(torchscript_w2, k, v)
    import numpy as np
    import torch
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    only = set(args.only.split(","))
    t0 = time.time()
    model = build(args.blocks, dtype="float32")
    torch.jit.script(model).save(os.path.join(args.out, "w2-fp32.pt"))
    tokens = np.random.default_rng(0).integers(0, V, size=BATCH * T * args.steps + 1, dtype=np.uint16)
    tokens.tofile(os.path.join(args.out, "tokens.bin"))
    print("scripted %d parameters in fp32 in %.0f s" % (sum(q.numel() for q in model.parameters()), time.time() - t0),
          file=sys.stderr)
    curves, rows = {}, []
    if "pytorch-autocast" in only:
        row, curves["pytorch-autocast"] = run_autocast(args, model, tokens)
        rows.append(row)
    del model
    for precision in ("bf16-mixed", "bf16"):
        name = "conveyor-" + precision
        if name not in only:
            continue
        path = os.path.join(args.out, name + ".yaml")
        job(path, ["name: " + name, "model: {torchscript: w2-fp32.pt}",
                   "data: {format: tokens, train: tokens.bin, dtype: uint16, seq_len: %d, shuffle: false}" % T,
                   "batch_size: %d" % BATCH, "micro_batches: %d" % args.micro_batches, "schedule: " + args.schedule,
                   "precision: " + precision,
                   "optimizer: {name: sgd, lr: %g}" % LR,
                   "steps: %d" % (args.steps if precision == "bf16-mixed" else min(args.steps, args.bf16_steps)),
                   "stage_timeout: 120"])
        row, curves[name] = run_conveyor(args, name, path)
        rows.append(row)
    ref = curves.get("pytorch-autocast") or []
    for r in rows:
        c = curves.get(r["variant"]) or []
        n = min(len(c), len(ref))
        r["max_loss_diff"] = round(max(abs(a - b) for a, b in zip(c[:n], ref[:n])), 4) if n else None
    print("| variant | ms / step | peak memory (GiB) | final loss | largest loss difference from pytorch-autocast |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| %s | %s | %s | %s | %s |" % (r["variant"], r.get("ms_per_step", r.get("error")), r.get("peak_gib"),
                                             r.get("final_loss"), r.get("max_loss_diff")))
    with open(os.path.join(args.out, "mixed-w2.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["variant", "ms_per_step", "peak_gib", "final_loss", "max_loss_diff", "error"])
        w.writeheader()
        for r in rows:
            w.writerow(r)
    with open(os.path.join(args.out, "mixed-w2-curves.csv"), "w", newline="") as f:
        names = list(curves)
        w = csv.writer(f)
        w.writerow(["step"] + names)
        for i in range(max((len(c) for c in curves.values()), default=0)):
            w.writerow([i] + [curves[n][i] if i < len(curves[n]) else "" for n in names])
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
