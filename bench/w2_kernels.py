#!/usr/bin/env python3
"""W2's kernel choices in PyTorch's own eager code, one at a time, in one process.

Issue 19 asks which of LibTorch's kernels (no compiler) bring W2's step down to
torch.compile's. Each variant changes one thing in bench/torch_pipelining.py's
W2 (GPT decoder, 1.34 B parameters, bf16, SGD, cross-entropy) and is timed in
the same process, against the plain eager step and torch.compile:

  eager            the model as bench.py's pytorch-1gpu runs it
  loss-half2float  log_softmax reads the bf16 logits and writes fp32 (one kernel,
                   no fp32 copy of the logits first), then nll_loss: what
                   cross_entropy(logits.float()) computes, without the copy
  sdpa-flash / sdpa-efficient / sdpa-cudnn   one attention backend forced
  sgd-fused        torch.optim.SGD(fused=True) instead of the multi-tensor step
  gelu-epilogue    fc1 and GELU as one cuBLASLt GEMM (torch._addmm_activation):
                   the tanh approximation of GELU, a different arithmetic (PyTorch
                   2.11 has no derivative for it: the row says so)
  compile          torch.compile(model), default mode

Before timing, each variant's loss and gradients of one forward and backward
from the same weights are compared with the eager step's: the largest
difference of the loss, and of the gradients relative to their largest value.

Prints a table (and JSON lines with --json).

usage: bench/w2_kernels.py [--batch 32] [--steps 8] [--warmup 3] [--variants a,b] [--profile-dir DIR]
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_pipelining as tp  # noqa: E402

VARIANTS = ["eager", "loss-half2float", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sgd-fused",
            "gelu-epilogue", "safe-all", "compile"]


def attention_context(variant):
    """A function that makes a fresh context for the variant's attention backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"sdpa-flash": [SDPBackend.FLASH_ATTENTION], "sdpa-efficient": [SDPBackend.EFFICIENT_ATTENTION],
                "sdpa-cudnn": [SDPBackend.CUDNN_ATTENTION],
                "safe-all": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]}
    if variant in backends:
        return lambda: sdpa_kernel(backends[variant])
    return contextlib.nullcontext


def gelu_epilogue(model):
    """fc1 + GELU of every block as one GEMM with cuBLASLt's GELU epilogue."""
    import torch
    import types

    def forward(s, x):
        b, t, w = x.shape
        q, k, v = s.qkv(s.n1(x)).view(b, t, 3, s_heads, w // s_heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(a.transpose(1, 2).reshape(b, t, w))
        h = torch._addmm_activation(s.fc1.bias, s.n2(x).view(b * t, w), s.fc1.weight.t(), use_gelu=True)
        return x + s.fc2(h.view(b, t, -1))

    s_heads = tp.GPT["heads"]
    for m in model:
        if hasattr(m, "fc1"):
            m.forward = types.MethodType(forward, m)


def make_loss(variant):
    import torch
    import torch.nn.functional as F
    if variant in ("loss-half2float", "safe-all"):
        return lambda out, y: F.nll_loss(F.log_softmax(out.flatten(0, 1), -1, dtype=torch.float32), y.flatten())
    return tp.loss_fn("w2")


def grads_of(model, lossf, x, y, ctx):
    with ctx():
        loss = lossf(model(x), y)
        loss.backward()
    g = [p.grad.detach().float().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return float(loss), g


def run(args):
    import torch
    dev = torch.device("cuda", 0)
    model = tp.build_stage("w2", 0, tp.NUM_UNITS["w2"], dev, 1000)
    x, y = tp.make_batch("w2", dev, dev, batch=args.batch)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref_loss, ref_grads = grads_of(model, tp.loss_fn("w2"), x, y, contextlib.nullcontext)
    rows = []
    for variant in [v for v in args.variants.split(",") if v]:
        model.load_state_dict(start)
        net = model
        if variant == "gelu-epilogue":
            gelu_epilogue(net)
        fwd = torch.compile(net) if variant == "compile" else net
        lossf = make_loss(variant)
        ctx = attention_context(variant)
        row = {"variant": variant, "batch": args.batch}
        try:
            loss, grads = grads_of(fwd, lossf, x, y, ctx)
            row["loss_diff"] = abs(loss - ref_loss)
            row["grad_rel_diff"] = max(float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
                                       for a, b in zip(grads, ref_grads))
            del grads
            opt = torch.optim.SGD(net.parameters(), lr=1e-3, fused=variant == "sgd-fused")

            def step():
                opt.zero_grad(set_to_none=True)
                with ctx():
                    loss = lossf(fwd(x), y)
                    loss.backward()
                opt.step()

            times = []
            for i in range(args.warmup + args.steps):
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t0)
            times = times[args.warmup:]
            row.update(ms=round(1000 * statistics.median(times), 2), ms_min=round(1000 * min(times), 2))
            if args.profile_dir:
                tp.profile_step(step, [dev], args, "w2-b%d-%s" % (args.batch, variant))
            del opt
        except Exception as e:  # a backend that refuses the shapes, out of memory: a row that says so
            row["error"] = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:160])
        for p in net.parameters():
            p.grad = None
        for m in net:
            m.__dict__.pop("forward", None)  # gelu-epilogue's patch
        torch.cuda.empty_cache()
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print("  %s: %s" % (variant, row), file=sys.stderr, flush=True)
    base = next((r["ms"] for r in rows if r["variant"] == "eager" and "ms" in r), None)
    print("| variant (batch %d) | ms / step | vs eager | loss diff | gradient diff (rel. to max) |" % args.batch)
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print("| %s | %s | | | |" % (r["variant"], r["error"]))
            continue
        print("| %s | %.1f | %s | %.2e | %.2e |" % (r["variant"], r["ms"], "%.3f" % (base / r["ms"]) if base else "-",
                                                   r["loss_diff"], r["grad_rel_diff"]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--profile-dir", default=None, help="one more step of each variant under torch.profiler")
    p.add_argument("--json", action="store_true")
    run(p.parse_args())


if __name__ == "__main__":
    main()
