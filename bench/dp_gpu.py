#!/usr/bin/env python3
"""The seed's comparison on GPUs: PyTorch DDP over R GPUs against Conveyor with R replicas of one stage.

Both train W1 (ResNet50, 128x128, MSE, SGD) on a global batch of --batch images split over R GPUs,
channels-last with cuDNN autotuning, and print ms per step (the mean of a window of steps after warm-up, as bench.py), images per second
and each against one GPU of its own kind:

  pytorch-1gpu-cl        one GPU, the whole batch (bench/torch_single.py's channels-last variant)
  pytorch-ddp-R          torch.nn.parallel.DistributedDataParallel, R processes, NCCL, batch / R each
  pytorch-ddp-R-graph    the same with each process's whole step (forward, backward with DDP's all-reduces,
                         SGD) captured once as a CUDA graph and replayed, by PyTorch's recipe for DDP
                         (DDP made on a side stream, 11 eager steps first, async error handling off): what
                         Conveyor's replicas do with their passes (cuda_graphs: auto)
  conveyor-1dev          `conveyor train --reference` on one GPU
  conveyor-1x1           one stage server on one GPU (`conveyor local`, replicas: 1): what a replica costs
                         before any all-reduce
  conveyor-Rx1           `conveyor local` with replicas: R, one stage each on its own GPU; the gradients
                         summed by NCCL on the devices (collectives: auto chooses it there); their passes
                         replayed as CUDA graphs (cuda_graphs: auto), the buckets all-reduced after them
  conveyor-Rx1-eager     the same with cuda_graphs: false: the buckets all-reduced during backward
  conveyor-Rx1-gloo      the same with collectives: gloo, c10d's Gloo group through host memory (what
                         replicas used before NCCL). Replicas need gloo's headers to build against the
                         PyTorch wheel (-DCONVEYOR_GLOO_INCLUDE_DIR): the NCCL group's id travels through
                         the Gloo group's store

Each Conveyor row is also checked from outside with --outside-steps N (bench.py's outside clock): the
same job run again for --steps + N steps, ms per step from the difference of the two runs' wall times
over N (start-up and teardown cancel), beside the row's own figure; a row more than 5% off is marked.
PyTorch's rows need none: their window is wall time between two device synchronizations.

usage: bench/bench.py dp (or bench/dp_gpu.py) [--bin build/bin] [--replicas 2] [--batch 240] [--steps 20] [--out DIR]
                                             [--variants pytorch-1gpu-cl,pytorch-ddp,pytorch-ddp-graph,conveyor-1dev,conveyor-rx1,...]
                                             [--outside-steps N] [--outside-repeats R]
"""
import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_outside  # noqa: E402
import bench_runners  # noqa: E402
import bench_workloads  # noqa: E402
import torch_pipelining as tp  # noqa: E402

WARMUP = bench_workloads.WARMUP  # Conveyor's steady rate leaves out its first 2 steps: both sides time the same steps


def ddp_worker(rank, world, port, batch, steps, out_path, graph=False):
    if graph:  # PyTorch's recipe for capturing DDP (CUDA semantics, "Usage with DistributedDataParallel")
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    model = tp.build_stage("w1", 0, tp.NUM_UNITS["w1"], dev, 1000, channels_last=True)
    side = torch.cuda.Stream() if graph else None  # DDP made, warmed up and captured on it
    with torch.cuda.stream(side) if graph else contextlib.nullcontext():
        ddp = DDP(model, device_ids=[rank])
    x, y = tp.make_batch("w1", dev, dev, channels_last=True, batch=batch // world)
    opt = torch.optim.SGD(ddp.parameters(), lr=tp.WORKLOADS["w1"]["lr"])
    lossf = tp.loss_fn("w1")
    def step():
        opt.zero_grad(set_to_none=not graph)  # a graph keeps its gradients' addresses
        lossf(ddp(x), y).backward()
        opt.step()

    # At least 11 eager DDP steps, then the capture, on the stream DDP was made on; replays after.
    run_step = tp.captured(step, 11, side) if graph else step
    # The clock of every bench row (torch_pipelining.window): a window of steps back to back.
    mean = torch.tensor([tp.window(run_step, lambda: torch.cuda.synchronize(dev), WARMUP, steps, dist.barrier)],
                        device=dev, dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"ms": 1000 * mean.item()}, f)
    if graph:
        # destroy_process_group() hangs in ncclCommDestroy once NCCL collectives were captured in a graph
        # (pytorch/pytorch#115388; both ranks hung there in the 2026-11-27 2x H100 runs' first try): each rank waits for its
        # own work and leaves without it.
        torch.cuda.synchronize(dev)
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def run_ddp(world, batch, steps, graph=False):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ddp.json")
        mp.start_processes(ddp_worker, args=(world, tp.free_port(), batch, steps, out, graph), nprocs=world,
                           start_method="spawn")
        return json.load(open(out))["ms"]


def run_torch_single(batch, steps):
    import torch_single
    r = torch_single.run("w1", "pytorch-1gpu-cl", batch, steps, WARMUP, "pytorch-1gpu-cl")
    return r["ms_per_iter"]


def job_text(batch, steps, replicas, collectives="auto", graphs=None):
    base = open(os.path.join(os.path.dirname(HERE), "examples", "resnet50-w1.yaml")).read()
    lines = [l for l in base.splitlines() if not l.startswith(("batch_size:", "steps:", "partition:", "replicas:",
                                                               "micro_batches:", "epochs:", "split_size:", "data:"))]
    lines += ["data: {name: synthetic, train_samples: %d, test_samples: 0}" % batch, "batch_size: %d" % batch, "steps: %d" % (steps + WARMUP), "partition: {stages: 1}",
              "replicas: %d" % replicas, "micro_batches: 1", "collectives: %s" % collectives]
    if graphs is not None:
        lines.append("cuda_graphs: %s" % ("true" if graphs else "false"))
    return "\n".join(lines) + "\n"


def run_conveyor(args, replicas, collectives="auto", graphs=None):
    """A Conveyor row: (ms per step, median steady step, outside-clock fields or {}), or None. With
    --outside-repeats R the outside check runs R of the longer runs and R - 1 more of the row's length,
    alternated, long first; the shortest wall of each length counts (bench.py's outside check)."""
    first = run_conveyor_once(args, replicas, collectives, graphs, args.steps)
    if first is None:
        return None
    ms, median, wall = first
    outside = {}
    if args.outside_steps:
        short, long_ = args.steps, args.steps + args.outside_steps
        walls, clocks = {short: [wall], long_: []}, {short: [ms], long_: []}
        repeats = max(1, getattr(args, "outside_repeats", 1))
        for n in bench_outside.outside_order(short, long_, repeats):
            again = run_conveyor_once(args, replicas, collectives, graphs, n)
            if again is None:
                return ms, median, {"outside_note": "the outside clock's run of %d steps failed" % n}
            walls[n].append(again[2])
            clocks[n].append(again[0])
        outside_ms, ratio, notes = bench_outside.judge_outside(ms, walls, clocks=clocks if repeats > 1 else None)
        outside = {"outside_ms_per_step": round(outside_ms, 2), "outside_ratio": round(ratio, 3),
                   "outside_note": "; ".join(notes),
                   "outside_walls": "; ".join("%d steps: %s s" % (n, "/".join("%.2f" % w for w in walls[n]))
                                              for n in (short, long_))}
    return ms, median, outside


def run_conveyor_once(args, replicas, collectives, graphs, steps):
    """One run of `steps` steps after the warm-up: (ms per step, median steady step, wall seconds)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(job_text(args.batch, steps, max(1, replicas), collectives, graphs))
        path = f.name
    exe = os.path.join(args.bin, "conveyor")
    if replicas == 0:
        cmd = [exe, "train", path, "--reference", "--device", "cuda:0", "--json"]
    else:
        cmd = [exe, "local", path, "--json", "--stages", str(replicas)]
    try:
        started = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - started
    finally:
        os.unlink(path)  # the job file, written for this run only
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        return None
    s = json.loads(p.stdout.strip().splitlines()[-1])
    # The median of the run's own step times beside its mean (bench.py's diagnostic; PyTorch's rows time
    # one window of steps and have no per-step figure to set beside it).
    return 1000.0 * args.batch / s["steady_samples_per_second"], bench_runners.median_steady_ms(s), wall


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench.py dp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "build", "bin"))
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--batch", type=int, default=240, help="the global batch (each GPU gets batch / replicas)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out", default="dp-gpu")
    ap.add_argument("--outside-steps", type=int, default=0,
                    help="check each Conveyor row from outside: run it again this many steps longer (0: no check)")
    ap.add_argument("--outside-repeats", type=int, default=2,
                    help="runs of each length for the outside check (the row's own one of them), the shortest wall of "
                         "each counting: W1's start-up varies by seconds from run to run")
    ap.add_argument("--variants", default="pytorch-1gpu-cl,pytorch-ddp,conveyor-1dev,conveyor-1x1,conveyor-rx1,conveyor-rx1-gloo",
                    help="comma-separated subset (rx1: R replicas of one stage)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    r = args.replicas
    rows = []
    known = (("pytorch-1gpu-cl", "pytorch-1gpu-cl", lambda: run_torch_single(args.batch, args.steps)),
             ("pytorch-ddp", "pytorch-ddp-%d" % r, lambda: run_ddp(r, args.batch, args.steps)),
             ("pytorch-ddp-graph", "pytorch-ddp-%d-graph" % r, lambda: run_ddp(r, args.batch, args.steps, graph=True)),
             ("conveyor-1dev", "conveyor-1dev", lambda: run_conveyor(args, 0)),
             ("conveyor-1x1", "conveyor-1x1", lambda: run_conveyor(args, 1)),
             ("conveyor-rx1", "conveyor-%dx1" % r, lambda: run_conveyor(args, r)),
             ("conveyor-rx1-eager", "conveyor-%dx1-eager" % r, lambda: run_conveyor(args, r, graphs=False)),
             ("conveyor-rx1-gloo", "conveyor-%dx1-gloo" % r, lambda: run_conveyor(args, r, "gloo")))
    by_key = {key: (name, fn) for key, name, fn in known}
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in by_key]
    if unknown:
        ap.error("unknown variant(s) %s; known: %s" % (",".join(unknown), ",".join(by_key)))
    for key in chosen:  # in the order given: a call cut short keeps the first ones' figures
        name, fn = by_key[key]
        median, outside = None, {}
        try:
            ms = fn()
            if isinstance(ms, tuple):
                ms, median, outside = ms
        except Exception as e:  # one variant failing leaves the others' figures
            sys.stderr.write("%s: %s\n" % (name, e))
            ms = None
        rows.append({"variant": name, "ms_per_step": round(ms, 2) if ms else "",
                     "images_per_second": round(1000.0 * args.batch / ms, 1) if ms else "",
                     "median_step_ms": round(median, 2) if median else "",
                     "outside_ms_per_step": outside.get("outside_ms_per_step", ""),
                     "outside_ratio": outside.get("outside_ratio", ""), "outside_note": outside.get("outside_note", ""),
                     "outside_walls": outside.get("outside_walls", "")})
        print("%-18s %s%s%s" % (name, "%.2f ms" % ms if ms else "failed",
                                " (median steady step %.2f ms)" % median if median else "",
                                " (outside %s ms, %sx%s)" % (outside["outside_ms_per_step"], outside["outside_ratio"],
                                                             ": " + outside["outside_note"] if outside["outside_note"] else "")
                                if "outside_ratio" in outside else ""), flush=True)
        write_csv(args.out, rows)  # after each row: a batch cut by its timeout keeps the rows it finished
    by_name = {row["variant"]: row["ms_per_step"] for row in rows}
    single = {"pytorch": by_name.get("pytorch-1gpu-cl"), "conveyor": by_name.get("conveyor-1dev")}
    print("\nW1, global batch %d over %d GPUs, %d steps after %d warm-up" % (args.batch, r, args.steps, WARMUP))
    print("| variant | ms / step | images / s | speed-up over one GPU of its kind | Conveyor's median steady step (ms) | outside clock (ms, ratio) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        base = single["pytorch" if row["variant"].startswith("pytorch") else "conveyor"]
        up = "%.2fx" % (base / row["ms_per_step"]) if base and row["ms_per_step"] else "-"
        outside = "%s, %sx" % (row["outside_ms_per_step"], row["outside_ratio"]) if row["outside_ratio"] != "" else "-"
        print("| %s | %s | %s | %s | %s | %s |" % (row["variant"], row["ms_per_step"] or "failed", row["images_per_second"] or "-",
                                                  up, row["median_step_ms"] or "-", outside))
    write_csv(args.out, rows)
    return 0


def write_csv(out, rows):
    with open(os.path.join(out, "dp-gpu.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["variant", "ms_per_step", "images_per_second", "median_step_ms",
                                          "outside_ms_per_step", "outside_ratio", "outside_note", "outside_walls"])
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
