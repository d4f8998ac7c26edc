#!/usr/bin/env python3
"""PyTorch at its best on one GPU: the baselines a user on one GPU would run.

For W1 (ResNet50, fp32, MSE, SGD) and W2 (the 1.34 B GPT decoder, bf16, SGD),
the same models as bench/torch_pipelining.py, whole on cuda:0:

  pytorch-1gpu           eager, as the seed's code (W1: NCHW, no cuDNN autotuning)
  pytorch-1gpu-cl        W1: channels-last memory and cudnn.benchmark
  pytorch-1gpu-graph     the whole training step (forward, backward, SGD step)
                         captured once as a CUDA graph and replayed (W1: channels-last)
  pytorch-1gpu-compile   torch.compile (default mode; W1: channels-last)

--batch B measures at that batch (a pipeline stage's micro-batch: W1 60,
W2 8 or 4); the variants' names then end in -bB. Each variant prints one JSON
line as torch_pipelining.py does (the mean of the timed steps run back to
back after --warmup untimed ones, between two device synchronizes: the clock
of Conveyor's steady rate; compile and capture happen before).

--profile-dir DIR profiles one more step of each variant with torch.profiler
(DIR/WORKLOAD-VARIANT.json, a Chrome trace for bench/profile_summary.py).

usage: bench/torch_single.py w1|w2 [--variants a,b] [--batch B] [--steps 10] [--warmup 3] [--profile-dir DIR]
"""
import argparse
import json
import sys

import torch_pipelining as tp

VARIANTS = ["pytorch-1gpu", "pytorch-1gpu-cl", "pytorch-1gpu-graph", "pytorch-1gpu-compile"]


def run(workload, variant, batch, steps, warmup, name, profile_dir=None):
    import torch
    dev = torch.device("cuda", 0)
    cl = workload == "w1" and variant != "pytorch-1gpu"
    torch.backends.cudnn.benchmark = cl
    torch.manual_seed(1000)
    model = tp.build_stage(workload, 0, tp.NUM_UNITS[workload], dev, 1000, channels_last=cl)
    x, y = tp.make_batch(workload, dev, dev, channels_last=cl, batch=batch)
    lossf = tp.loss_fn(workload)
    opt = torch.optim.SGD(model.parameters(), lr=tp.WORKLOADS[workload]["lr"])
    fwd = torch.compile(model) if variant == "pytorch-1gpu-compile" else model
    last = {}

    def step():
        opt.zero_grad(set_to_none=variant != "pytorch-1gpu-graph")
        loss = lossf(fwd(x), y)
        loss.backward()
        opt.step()
        last["loss"] = loss

    run_step = tp.captured(step, 3) if variant == "pytorch-1gpu-graph" else step
    torch.cuda.reset_peak_memory_stats(dev)
    mean = tp.window(run_step, lambda: torch.cuda.synchronize(dev), warmup, steps)
    # --profile-dir: one more step under torch.profiler, DIR/w1-NAME.json (bench/profile_summary.py)
    tp.profile_step(run_step, [dev], argparse.Namespace(profile_dir=profile_dir), "%s-%s" % (workload, name))
    w = tp.WORKLOADS[workload]
    return {"workload": workload, "variant": name, "schedule": "single", "micro_batches": 1, "stages": 1,
            "ranks": 1, "gpus": 1, "batch": batch, "unit": w["unit"], "ms_per_iter": round(1000 * mean, 3),
            "iters": steps, "warmup": warmup, "statistic": tp.statistic(steps, warmup),
            "samples_per_second": round(batch / mean, 3),
            "throughput": round(batch * w["per_sample"] / mean, 1), "loss": round(float(last["loss"].detach()), 5),
            "peak_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=sorted(tp.WORKLOADS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=0, help="samples per step (default: the workload's)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile-dir", default=None,
                   help="after the timed steps, profile one more with torch.profiler: DIR/WORKLOAD-VARIANT.json")
    a = p.parse_args()
    import torch
    batch = a.batch or tp.WORKLOADS[a.workload]["batch"]
    for v in [v for v in a.variants.split(",") if v]:
        if v not in VARIANTS:
            sys.exit("torch_single.py: unknown variant %s (one of %s)" % (v, ", ".join(VARIANTS)))
        if v == "pytorch-1gpu-cl" and a.workload != "w1":
            continue  # channels-last is for convolutions
        try:
            r = run(a.workload, v, batch, a.steps, a.warmup, "%s-b%d" % (v, batch) if a.batch else v, a.profile_dir)
        except Exception as e:  # out of memory, a compiler failure: a row that says so
            r = {"workload": a.workload, "variant": v, "batch": batch, "error": "%s: %s" % (
                type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
        print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
        torch._dynamo.reset() if hasattr(torch, "_dynamo") else None


if __name__ == "__main__":
    main()
