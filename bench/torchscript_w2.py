#!/usr/bin/env python3
"""W2's decoder written in Python, scripted, and trained by Conveyor, beside the zoo's gpt.

Builds the 1.34 B-parameter GPT decoder of W2 (../shared/BENCHMARKS.md) as an
nn.Sequential of torch.nn modules (token + position embedding, 24 pre-norm
blocks with causal scaled-dot-product attention and a GELU MLP, final norm and
output layer; bench/torch_pipelining.py's model, made scriptable), saves it
with torch.jit.script in bf16, writes a file of random uint16 token ids, and
times, on one device, one after the other:

  zoo-gpt          `conveyor train --reference` of examples/gpt-w2.yaml (the zoo's gpt)
  torchscript-gpt  the same, with model: {torchscript: w2.pt} and data: {format: tokens}
  pytorch-eager    the same scripted module's eager original in a plain PyTorch loop

all bf16, SGD, batch 32 x 1024 tokens, and prints a table (ms per step after
the warm-up steps) and a CSV.

usage: bench/torchscript_w2.py [--bin build/bin] [--out DIR] [--steps 8] [--device cuda:0] [--blocks 24]
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
ROOT = os.path.dirname(HERE)
V, W, H, M, T = 32000, 2048, 16, 8192, 1024
BATCH = 32


def build(blocks, dtype="bfloat16"):
    """W2's decoder with `blocks` blocks, its parameters in `dtype` (a torch dtype's name)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(V, W)
            self.pos = nn.Embedding(T, W)

        def forward(self, x):
            return self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = nn.LayerNorm(W)
            self.qkv = nn.Linear(W, 3 * W)
            self.proj = nn.Linear(W, W)
            self.n2 = nn.LayerNorm(W)
            self.fc1 = nn.Linear(W, M)
            self.fc2 = nn.Linear(M, W)
            self.heads = H  # an attribute: TorchScript does not read Python globals

        def forward(self, x):
            b, t, w = x.shape[0], x.shape[1], x.shape[2]
            qkv = self.qkv(self.n1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
            return x + self.fc2(F.gelu(self.fc1(self.n2(x))))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(W)
            self.out = nn.Linear(W, V)

        def forward(self, x):
            return self.out(self.norm(x))

    torch.manual_seed(0)
    return nn.Sequential(Embedding(), *[Block() for _ in range(blocks)], Head()).to(getattr(torch, dtype))


def job(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run_conveyor(args, name, job_path):
    cmd = [os.path.join(args.bin, "conveyor"), "train", job_path, "--reference", "--device", args.device, "--json"]
    log = os.path.join(args.out, name + ".log")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    open(log, "w").write(proc.stderr)
    if proc.returncode != 0:
        return {"variant": name, "error": "exit %d, see %s" % (proc.returncode, log)}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    sps = r["steady_samples_per_second"]
    return {"variant": name, "ms_per_step": round(1000.0 * BATCH / sps, 1), "final_loss": r.get("final_loss")}


def run_eager(args, model):
    import torch
    import torch.nn.functional as F
    dev = torch.device(args.device)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randint(V, (BATCH, T), device=dev)
    y = torch.randint(V, (BATCH, T), device=dev)
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    model.to("cpu")
    torch.cuda.empty_cache()
    return {"variant": "pytorch-eager", "ms_per_step": round(1000 * statistics.median(times[2:]), 1),
            "final_loss": round(float(loss), 4)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--out", default="torchscript-w2")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--timeout", type=int, default=240)
    args = p.parse_args()
    import numpy as np
    import torch
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    t0 = time.time()
    model = build(args.blocks)
    torch.jit.script(model).save(os.path.join(out, "w2.pt"))
    tokens = np.random.default_rng(0).integers(0, V, size=BATCH * T * (args.steps + 1) + 1, dtype=np.uint16)
    tokens.tofile(os.path.join(out, "tokens.bin"))
    print("scripted %d parameters in %.0f s" % (sum(p.numel() for p in model.parameters()), time.time() - t0),
          file=sys.stderr)
    common = ["batch_size: %d" % BATCH, "micro_batches: 1", "precision: bf16", "optimizer: {name: sgd, lr: 0.001}",
              "steps: %d" % args.steps, "stage_timeout: 120"]
    job(os.path.join(out, "zoo.yaml"),
        ["name: zoo-gpt", "model: {name: gpt, vocab: %d, width: %d, blocks: %d, heads: %d, mlp_width: %d, "
         "seq_len: %d}" % (V, W, args.blocks, H, M, T),
         "data: {name: synthetic, train_samples: %d, test_samples: 0}" % (BATCH * args.steps)] + common)
    job(os.path.join(out, "script.yaml"),
        ["name: torchscript-gpt", "model: {torchscript: w2.pt}",
         "data: {format: tokens, train: tokens.bin, dtype: uint16, seq_len: %d, shuffle: false}" % T] + common)
    rows = [run_eager(args, model)]
    del model
    rows.append(run_conveyor(args, "zoo-gpt", os.path.join(out, "zoo.yaml")))
    rows.append(run_conveyor(args, "torchscript-gpt", os.path.join(out, "script.yaml")))
    zoo = next((r["ms_per_step"] for r in rows if r["variant"] == "zoo-gpt" and "ms_per_step" in r), None)
    print("| variant | ms / step | vs zoo-gpt |\n| --- | --- | --- |")
    for r in rows:
        ms = r.get("ms_per_step")
        print("| %s | %s | %s |" % (r["variant"], ms if ms else r.get("error"),
                                    "%.3f" % (ms / zoo) if ms and zoo else "-"))
    with open(os.path.join(out, "torchscript-w2.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["variant", "ms_per_step", "final_loss", "error"])
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
