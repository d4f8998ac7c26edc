#!/usr/bin/env python3
"""The seed's data-parallel comparison: its ConvNet on Fashion-MNIST, one GPU against two.

Trains examples/fashion-convnet.yaml's job (the zoo's `convnet`, its optimizer, learning rate,
batch size, seed and epochs, eval after every epoch) four ways, one after the other:

  pytorch-1gpu    a plain PyTorch loop on cuda:0; the whole data set held in GPU memory (no DataLoader)
  pytorch-ddp-2   torch.nn.parallel.DistributedDataParallel, 2 processes (NCCL, one GPU each); each
                  rank trains on a disjoint half of every global batch, so each step's arithmetic is the
                  one-GPU step's up to summation order; rank 0 computes the test accuracy
  conveyor-1dev   `conveyor train JOB --reference --device cuda:0 --json`
  conveyor-2x1    `conveyor local JOB --json` with `replicas: 2` and `partition: {stages: 1}`: two stage
                  servers, one per GPU (`conveyor local` puts server i on cuda:i), their gradients
                  summed by NCCL on the devices (docs/parallelism.md); their passes replayed as CUDA graphs
  conveyor-2x1-eager  the same with `cuda_graphs: false` (only when asked by name in --variants)

The PyTorch loops start from Conveyor's initial weights (model/models.cpp InitLayer: each Conv2d and
Linear layer U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from a generator of its own) and walk each epoch in
Conveyor's order (model/dataset.cpp: torch.randperm from a generator seeded with mix(seed, 1000 +
epoch), the last incomplete batch dropped), so their losses track Conveyor's where the two sides'
PyTorch versions draw the same random numbers. Inputs are the IDX bytes / 255, as Conveyor reads them.

Every variant runs in a process of its own under --timeout; one that fails prints its error and the
script goes on. Conveyor's figures come from its `--json` summary's `epochs` (per epoch: the mean of
the steps' losses, the test accuracy after it, its training time without the evaluation). The PyTorch
loops report the same: the mean of the epoch's batch losses, the accuracy on the whole test split
after it, the epoch's training time (synchronised, evaluation excluded). The first epoch includes
each side's warm-up (cuDNN autotuning, CUDA context, lazy initialisation); "later epochs" excludes it.

Conveyor is run with `micro_batches: 1` by default (--micro-batches): the example's 8 suit its
4-stage pipeline, not one stage; with replicas each replica cuts its half of the batch into them.
The memory format follows Conveyor's `memory_format: auto` (channels-last on CUDA for the ConvNet)
on both sides unless --memory-format says otherwise; cuDNN autotuning is on for both.

Output: markdown tables on stdout (per epoch, and a summary with each variant's time per epoch and its
speed-up over one device of its own kind), and in --out: dp-fmnist-epochs.csv, dp-fmnist-summary.csv
(both rewritten after every variant, so a run cut short keeps what it measured), each variant's JSON
and log, and the job files given to Conveyor.

usage:
  bench/dp_fmnist.py [--bin build/bin] [--out DIR] [--epochs 3] [--variants pytorch-1gpu,conveyor-2x1]
                     [--timeout 120] [--device cuda|cpu] [--train-limit N] [--test-limit N]
  bench/dp_fmnist.py --device cpu --epochs 1 --train-limit 2048 --test-limit 512    # a smoke test

--device cpu runs everything on the CPU (DDP over Gloo, `conveyor ... --device cpu`): a check of the
script and of the equalities, not a benchmark. --train-limit/--test-limit keep the first N samples of
each split (Conveyor then reads them from torch.save'd files, `data: {format: tensors}`, written to
--out/data). Without the data folder (--data-dir, default the example's path) the script unpacks
.gpu/dataset-fashion-mnist_*.deb into --out if there is one.
"""
import argparse
import csv
import glob
import gzip
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "fashion-convnet.yaml")
VARIANTS = ("pytorch-1gpu", "pytorch-ddp-2", "conveyor-1dev", "conveyor-2x1")
OPTIONAL = ("conveyor-2x1-eager",)  # asked by name: the replicas without CUDA graphs
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ------------------------------------------------------------ the job and its data --

def mix(seed, salt):
    """Conveyor's seed mixer (model/dataset.cpp MixSeed, splitmix64's finaliser)."""
    z = (seed + GOLDEN * (salt + 1)) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def parse_scalar(text):
    text = text.strip().strip("'\"")
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_flow_map(text):
    """`{a: 1, b: x}` (a flat YAML flow mapping, as the example writes them) -> dict."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return {"name": parse_scalar(text)}  # `optimizer: adam`
    out = {}
    for item in text[1:-1].split(","):
        if item.strip():
            k, _, v = item.partition(":")
            out[k.strip()] = parse_scalar(v)
    return out


def example_settings(path):
    """The keys of the example job that the PyTorch loops need (top-level `key: value` lines;
    no YAML library needed, and none may be installed on the GPU machine)."""
    keys = {}
    for line in open(path):
        line = line.split("#", 1)[0].rstrip()
        m = re.match(r"^([a-z_]+):\s*(.+)$", line)
        if m:
            keys[m.group(1)] = m.group(2)
    opt = parse_flow_map(keys.get("optimizer", "sgd"))
    model = parse_flow_map(keys.get("model", "convnet"))
    data = parse_flow_map(keys.get("data", "synthetic"))
    if model.get("name") != "convnet" or keys.get("loss", "cross_entropy") != "cross_entropy":
        raise SystemExit("dp_fmnist.py: %s is not the ConvNet with cross-entropy" % path)
    if opt.get("name") not in ("sgd", "adam"):
        raise SystemExit("dp_fmnist.py: optimizer %r: only sgd and adam are mirrored" % opt.get("name"))
    known = {"name", "lr", "momentum", "weight_decay", "nesterov", "eps"}
    if set(opt) - known:
        raise SystemExit("dp_fmnist.py: optimizer keys %s are not mirrored" % sorted(set(opt) - known))
    return {
        "batch_size": int(keys.get("batch_size", 32)),
        "epochs": int(keys.get("epochs", 1)),
        "seed": int(keys.get("seed", 0)),
        "eval_batch_size": int(keys.get("eval_batch_size", 1000)),
        "num_classes": int(model.get("num_classes", 10)),
        "optimizer": opt,
        "data_path": data.get("path", "/usr/share/datasets/fashion-mnist"),
    }


def read_idx(path):
    """A gzipped IDX file (big-endian header: magic with the rank in its last byte, then the
    dimensions) -> uint8 tensor."""
    import torch
    with gzip.open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    dims = struct.unpack(">%dI" % rank, raw[4:4 + 4 * rank])
    body = bytearray(raw[4 + 4 * rank:])
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def load_split(data_dir, split, limit):
    """(images as float [N, 1, 28, 28] / 255, labels int64 [N]), the first `limit` if given,
    as model/dataset.cpp reads them."""
    import torch
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    if limit:
        x, y = x[:limit], y[:limit]
    return x.unsqueeze(1).to(torch.float32).div_(255.0), y.to(torch.int64)


def find_data(args, out):
    if os.path.isfile(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz")):
        return args.data_dir
    # The GPU machines may lack Debian's package: unpack the copy carried in .gpu/ (bench/gpu/common.sh).
    debs = sorted(glob.glob(os.path.join(ROOT, ".gpu", "dataset-fashion-mnist_*.deb")))
    if debs:
        dest = os.path.join(out, "fashion-mnist-deb")
        subprocess.run(["dpkg", "-x", debs[0], dest], check=True)
        found = os.path.join(dest, "usr", "share", "datasets", "fashion-mnist")
        if os.path.isdir(found):
            print("data: unpacked %s into %s" % (debs[0], found), flush=True)
            return found
    raise SystemExit("dp_fmnist.py: no Fashion-MNIST in %s (install dataset-fashion-mnist, or --data-dir)" % args.data_dir)


# ------------------------------------------------------------------ the PyTorch side --

def convnet(num_classes):
    """The zoo's `convnet` (model/models.cpp), layer for layer: 12 layers, the same indices."""
    from torch import nn
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),      # 0 1 2
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),     # 3 4 5
        nn.Flatten(),                                         # 6
        nn.Linear(16 * 4 * 4, 120), nn.ReLU(),                # 7 8
        nn.Linear(120, 84), nn.ReLU(),                        # 9 10
        nn.Linear(84, num_classes))                           # 11


def init_like_conveyor(model, seed):
    """model/models.cpp InitLayer: layer i's weight then bias U(-b, b), b = 1/sqrt(fan_in), from a
    CPU generator seeded with seed * golden + i + 1 (on the CPU: the same draws as LibTorch's)."""
    import torch
    with torch.no_grad():
        for i, layer in enumerate(model):
            if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
                g = torch.Generator().manual_seed((seed * GOLDEN + i + 1) & MASK64)
                bound = 1.0 / math.sqrt(layer.weight.numel() / layer.weight.size(0))
                for p in (layer.weight, layer.bias):
                    p.uniform_(-bound, bound, generator=g)


def make_optimizer(params, opt):
    import torch
    lr = float(opt.get("lr", 0.01 if opt["name"] == "sgd" else 0.001))
    wd = float(opt.get("weight_decay", 0))
    if opt["name"] == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(opt.get("momentum", 0)), weight_decay=wd,
                               nesterov=bool(opt.get("nesterov", False)))
    return torch.optim.Adam(params, lr=lr, weight_decay=wd, eps=float(opt.get("eps", 1e-8)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_worker(rank, cfg):
    """One process of a PyTorch variant: world 1 is the plain loop, world 2 DDP. Rank 0 writes the
    result (per epoch: mean loss, test accuracy, training seconds) to cfg["result"]."""
    import torch
    import torch.nn.functional as F
    world = cfg["world"]
    cuda = cfg["device"] == "cuda"
    if cuda:
        if torch.cuda.device_count() < world:
            raise RuntimeError("%d CUDA device(s), %d needed" % (torch.cuda.device_count(), world))
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True  # Conveyor's cudnn_benchmark default
    else:
        dev = torch.device("cpu")
        if world > 1:  # the cores shared between the ranks, as `conveyor local` shares them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl" if cuda else "gloo", init_method="tcp://127.0.0.1:%d" % cfg["port"],
                                rank=rank, world_size=world)
    cl = cfg["channels_last"]
    fmt = torch.channels_last if cl else torch.contiguous_format

    # The whole data set on the device, once.
    train_x, train_y = load_split(cfg["data_dir"], "train", cfg["train_limit"])
    test_x, test_y = load_split(cfg["data_dir"], "test", cfg["test_limit"])
    train_x, train_y = train_x.to(dev).contiguous(memory_format=fmt), train_y.to(dev)
    test_x, test_y = test_x.to(dev).contiguous(memory_format=fmt), test_y.to(dev)

    model = convnet(cfg["num_classes"])
    init_like_conveyor(model, cfg["seed"])
    model = model.to(dev, memory_format=fmt)
    net = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = DDP(model, device_ids=[rank] if cuda else None)
    opt = make_optimizer(net.parameters(), cfg["optimizer"])

    b = cfg["batch_size"]
    share = b // world  # rank r trains on rows [r*share, (r+1)*share) of each global batch
    n = train_x.size(0)
    steps = n // b  # the last incomplete batch dropped, as Conveyor does
    if steps < 1:
        raise RuntimeError("batch %d is larger than the training split (%d)" % (b, n))

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def evaluate():
        model.eval()
        correct, loss_sum = 0, 0.0
        with torch.no_grad():
            for i in range(0, test_x.size(0), cfg["eval_batch_size"]):
                x, y = test_x[i:i + cfg["eval_batch_size"]], test_y[i:i + cfg["eval_batch_size"]]
                out = model(x.contiguous(memory_format=fmt))
                correct += int((out.argmax(1) == y).sum())
                loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
        model.train()
        m = max(1, test_x.size(0))
        return correct / m, loss_sum / m

    epochs = []
    for epoch in range(cfg["epochs"]):
        if world > 1:
            dist.barrier()
        sync()
        t0 = time.perf_counter()
        # This epoch's order: Conveyor's permutation (drawn on the CPU, as LibTorch draws it).
        g = torch.Generator().manual_seed(mix(cfg["seed"], 1000 + epoch))
        perm = torch.randperm(n, generator=g).to(dev)
        loss_sum = torch.zeros((), device=dev)
        for pos in range(steps):
            idx = perm[pos * b + rank * share:pos * b + (rank + 1) * share]
            x = train_x[idx]
            if cl:
                x = x.contiguous(memory_format=fmt)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), train_y[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.detach()  # read once per epoch: no host sync per step
        sync()
        seconds = time.perf_counter() - t0
        if world > 1:  # the global batch's loss is the mean of the equal halves' losses
            dist.all_reduce(loss_sum)
        mean_loss = float(loss_sum) / (steps * world)
        row = {"epoch": epoch + 1, "mean_loss": mean_loss, "train_seconds": seconds,
               "samples_per_second": steps * b / seconds}
        if rank == 0:
            row["eval_accuracy"], row["eval_loss"] = evaluate()
            print("%s epoch %d: loss %.4f, test accuracy %.2f%%, %.2f s" % (
                cfg["variant"], epoch + 1, mean_loss, 100 * row["eval_accuracy"], seconds), file=sys.stderr, flush=True)
        epochs.append(row)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        with open(cfg["result"], "w") as f:
            json.dump({"epochs": epochs, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
                       "steps_per_epoch": steps}, f, indent=1)


def worker_main(cfg_path):
    cfg = json.load(open(cfg_path))
    if cfg["world"] == 1:
        torch_worker(0, cfg)
        return 0
    import torch.multiprocessing as mp
    cfg["port"] = free_port()
    mp.start_processes(torch_worker, args=(cfg,), nprocs=cfg["world"], start_method="spawn")
    return 0


# ----------------------------------------------------------------------- running --

def run_cmd(cmd, timeout, log_path):
    """Runs cmd in a session of its own (so that a timeout ends it and what it started: DDP's
    ranks; `conveyor local` stops its servers on SIGTERM). Returns (rc, stdout, seconds); stderr
    goes to log_path."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
            raise RuntimeError("timed out after %d s (log: %s)" % (timeout, log_path))
    return p.returncode, out, time.perf_counter() - t0


def log_tail(path, n=2500):
    try:
        return open(path, errors="replace").read()[-n:]
    except OSError:
        return ""


def run_torch(args, st, variant, world, data_dir):
    tag = os.path.join(args.out, variant)
    cfg = {"variant": variant, "world": world, "device": args.device, "data_dir": data_dir,
           "train_limit": args.train_limit, "test_limit": args.test_limit, "epochs": args.epochs,
           "batch_size": st["batch_size"], "eval_batch_size": st["eval_batch_size"], "seed": st["seed"],
           "num_classes": st["num_classes"], "optimizer": st["optimizer"], "result": tag + ".json",
           "channels_last": channels_last(args)}
    if os.path.exists(cfg["result"]):
        os.remove(cfg["result"])
    with open(tag + "-config.json", "w") as f:
        json.dump(cfg, f, indent=1)
    rc, _, wall = run_cmd([sys.executable, os.path.abspath(__file__), "--worker", tag + "-config.json"],
                          args.timeout, tag + ".log")
    if rc != 0 or not os.path.exists(cfg["result"]):
        raise RuntimeError("exit %d:\n%s" % (rc, log_tail(tag + ".log")))
    r = json.load(open(cfg["result"]))
    r["wall_seconds"] = wall
    r["note"] = "%s, torch %s" % (r["device"], r["torch"])
    return r


def channels_last(args):
    if args.memory_format == "auto":
        return args.device == "cuda"  # what Conveyor's memory_format: auto does for the ConvNet
    return args.memory_format == "channels_last"


def job_text(args, name, replicas, data_line, extra=()):
    """The example job with one stage, R replicas, --epochs, --micro-batches, our data line and `extra` lines."""
    drop = ("name:", "partition:", "replicas:", "micro_batches:", "split_size:", "epochs:", "steps:", "data:",
            "eval:", "memory_format:")
    lines = ["# bench/dp_fmnist.py's %s: examples/fashion-convnet.yaml on one stage, %d replica(s)" % (name, replicas)]
    lines += [l for l in open(EXAMPLE).read().splitlines() if not l.startswith(drop + ("#",))]
    lines += ["name: %s" % name, data_line, "partition: {stages: 1}", "replicas: %d" % replicas,
              "micro_batches: %d" % args.micro_batches, "epochs: %d" % args.epochs, "eval: true"] + list(extra)
    if args.memory_format != "auto":
        lines.append("memory_format: %s" % args.memory_format)
    return "\n".join(lines) + "\n"


def run_conveyor(args, variant, replicas, data_line, extra=()):
    tag = os.path.join(args.out, variant)
    job = tag + ".yaml"
    with open(job, "w") as f:
        f.write(job_text(args, "fmnist-" + variant, max(1, replicas), data_line, extra))
    exe = os.path.join(args.bin, "conveyor")
    if not os.access(exe, os.X_OK):
        raise RuntimeError("no %s (build first, or --bin)" % exe)
    if replicas == 0:
        cmd = [exe, "train", job, "--reference", "--device", "cuda:0" if args.device == "cuda" else "cpu", "--json"]
    else:
        cmd = [exe, "local", job, "--json", "--device", args.device]
    rc, out, wall = run_cmd(cmd, args.timeout, tag + ".log")
    if rc != 0:
        raise RuntimeError("exit %d:\n%s" % (rc, log_tail(tag + ".log")))
    try:  # one JSON object on stdout; take the last line if something else came before it
        s = json.loads(out)
    except ValueError:
        s = json.loads(out.strip().splitlines()[-1])
    with open(tag + ".json", "w") as f:
        json.dump(s, f, indent=1)
    epochs = s.get("epochs") or []
    r = {"wall_seconds": wall, "epochs": epochs,
         "note": "; ".join("replica %s stage %s on %s" % (x.get("replica"), x.get("index"), x.get("device"))
                           for x in s.get("stages", [])) or "reference, one process"}
    if not epochs:  # no per-epoch reports: the whole run's figures only, said so in the table
        losses = s.get("losses") or []
        r["epochs"] = [{"epoch": "all", "mean_loss": sum(losses) / len(losses) if losses else None,
                        "eval_accuracy": s.get("eval_accuracy"), "train_seconds": s.get("elapsed_seconds"),
                        "samples_per_second": s.get("samples_per_second")}]
        r["note"] += "; whole run only (no per-epoch reports in --json)"
    return r


# ------------------------------------------------------------------------ output --

EPOCH_FIELDS = ["variant", "epoch", "train_loss", "test_accuracy", "epoch_seconds", "samples_per_second"]
SUMMARY_FIELDS = ["variant", "kind", "devices", "epochs", "first_epoch_s", "later_epochs_mean_s",
                  "speedup_vs_1dev", "speedup_vs_pytorch_1gpu", "final_test_accuracy", "wall_s", "status", "note"]


def fmt(v, spec):
    return spec % v if isinstance(v, (int, float)) and not isinstance(v, bool) else ("-" if v in (None, "") else str(v))


def summarise(results):
    """One summary row per variant; the speed-up compares the steady time per epoch (the mean of
    epochs 2.., or epoch 1 when there is only one) with the one-device variant of the same kind."""
    rows = []
    for name, r in results:
        kind = "pytorch" if name.startswith("pytorch") else "conveyor"
        row = {"variant": name, "kind": kind, "devices": 1 if name in ("pytorch-1gpu", "conveyor-1dev") else 2,
               "status": "ok" if "error" not in r else "failed", "note": r.get("note", "")}
        ep = [e for e in r.get("epochs", []) if e.get("train_seconds")]
        if ep:
            row["epochs"] = len(ep)
            row["first_epoch_s"] = ep[0]["train_seconds"]
            later = [e["train_seconds"] for e in ep[1:]]
            row["later_epochs_mean_s"] = sum(later) / len(later) if later else ""
            row["final_test_accuracy"] = ep[-1].get("eval_accuracy")
        row["steady_s"] = row.get("later_epochs_mean_s") or row.get("first_epoch_s")
        row["wall_s"] = r.get("wall_seconds")
        rows.append(row)
    base = {}
    for row in rows:
        if row["devices"] == 1 and row["steady_s"]:
            base[row["kind"]] = row["steady_s"]
    for row in rows:
        b, p = base.get(row["kind"]), base.get("pytorch")
        row["speedup_vs_1dev"] = round(b / row["steady_s"], 3) if b and row["steady_s"] else ""
        row["speedup_vs_pytorch_1gpu"] = round(p / row["steady_s"], 3) if p and row["steady_s"] else ""
    return rows


def write_outputs(args, results, final):
    epoch_rows = []
    for name, r in results:
        for e in r.get("epochs", []):
            epoch_rows.append({"variant": name, "epoch": e.get("epoch"), "train_loss": e.get("mean_loss"),
                               "test_accuracy": e.get("eval_accuracy"), "epoch_seconds": e.get("train_seconds"),
                               "samples_per_second": e.get("samples_per_second")})
    summary = summarise(results)
    with open(os.path.join(args.out, "dp-fmnist-epochs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=EPOCH_FIELDS)
        w.writeheader()
        w.writerows(epoch_rows)
    with open(os.path.join(args.out, "dp-fmnist-summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(summary)
    if not final:
        return
    print("\n| variant | epoch | train loss | test accuracy | epoch time (s) | samples / s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for e in epoch_rows:
        acc = 100 * e["test_accuracy"] if isinstance(e["test_accuracy"], (int, float)) else None
        print("| %s | %s | %s | %s | %s | %s |" % (e["variant"], e["epoch"], fmt(e["train_loss"], "%.4f"),
                                                fmt(acc, "%.2f%%"), fmt(e["epoch_seconds"], "%.2f"),
                                                fmt(e["samples_per_second"], "%.0f")))
    print("\n| variant | devices | epoch 1 (s) | later epochs, mean (s) | speed-up vs 1 device of its kind "
          "| vs pytorch-1gpu | final test accuracy | wall (s) | status |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for s in summary:
        acc = 100 * s["final_test_accuracy"] if isinstance(s.get("final_test_accuracy"), (int, float)) else None
        print("| %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            s["variant"], s["devices"], fmt(s.get("first_epoch_s"), "%.2f"), fmt(s.get("later_epochs_mean_s"), "%.2f"),
            fmt(s["speedup_vs_1dev"], "%.2fx"), fmt(s["speedup_vs_pytorch_1gpu"], "%.2fx"), fmt(acc, "%.2f%%"),
            fmt(s.get("wall_s"), "%.1f"), s["status"]))
    print("\nspeed-ups compare the later epochs' mean time (epoch 1's with one epoch); wall: the variant's "
          "whole process (start-up, data loading, every epoch and evaluation).")
    for s in summary:
        if s["note"]:
            print("%s: %s" % (s["variant"], s["note"]))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="dp_fmnist.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="the folder holding conveyor")
    ap.add_argument("--out", default="dp-fmnist")
    ap.add_argument("--epochs", type=int, default=None, help="default: the example's (3)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS + OPTIONAL))
    ap.add_argument("--timeout", type=int, default=120, help="seconds per variant")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--data-dir", default=None, help="the IDX .gz files (default: the example's data.path)")
    ap.add_argument("--train-limit", type=int, default=0, help="only the first N training samples (0: all)")
    ap.add_argument("--test-limit", type=int, default=0, help="only the first N test samples (0: all)")
    ap.add_argument("--micro-batches", type=int, default=1, help="Conveyor's micro_batches (per replica share)")
    ap.add_argument("--memory-format", choices=("auto", "contiguous", "channels_last"), default="auto")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one PyTorch variant, from its config file
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)

    st = example_settings(EXAMPLE)
    args.epochs = args.epochs or st["epochs"]
    args.data_dir = args.data_dir or st["data_path"]
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS + OPTIONAL]
    if unknown:
        ap.error("unknown variant(s) %s; choose from %s" % (", ".join(unknown), ", ".join(VARIANTS + OPTIONAL)))
    if st["batch_size"] % 2:
        ap.error("the example's batch %d does not split over 2" % st["batch_size"])
    args.out = os.path.abspath(args.out)
    args.bin = os.path.abspath(args.bin)
    os.makedirs(args.out, exist_ok=True)
    data_dir = find_data(args, args.out)

    # Conveyor's data: the example's folder as it is, or the first N samples as tensors files.
    data_line = "data: {name: fashion-mnist, path: %s}" % data_dir
    if (args.train_limit or args.test_limit) and any(v.startswith("conveyor") for v in names):
        import torch
        d = os.path.join(args.out, "data")
        os.makedirs(d, exist_ok=True)
        for split, limit in (("train", args.train_limit), ("test", args.test_limit)):
            x, y = load_split(data_dir, split, limit)
            torch.save({"inputs": x, "targets": y}, os.path.join(d, split + ".pt"))
        data_line = "data: {format: tensors, train: %s, test: %s}" % (os.path.join(d, "train.pt"),
                                                                      os.path.join(d, "test.pt"))

    print("ConvNet on Fashion-MNIST (%s%s): batch %d (2 devices: %d each), %s, seed %d, %d epoch(s), device %s" % (
        data_dir, ", first %s/%s samples" % (args.train_limit or "all", args.test_limit or "all")
        if args.train_limit or args.test_limit else "", st["batch_size"], st["batch_size"] // 2,
        ", ".join("%s=%s" % kv for kv in st["optimizer"].items()), st["seed"], args.epochs, args.device), flush=True)
    runs = {
        "pytorch-1gpu": lambda: run_torch(args, st, "pytorch-1gpu", 1, data_dir),
        "pytorch-ddp-2": lambda: run_torch(args, st, "pytorch-ddp-2", 2, data_dir),
        "conveyor-1dev": lambda: run_conveyor(args, "conveyor-1dev", 0, data_line),
        "conveyor-2x1": lambda: run_conveyor(args, "conveyor-2x1", 2, data_line),
        "conveyor-2x1-eager": lambda: run_conveyor(args, "conveyor-2x1-eager", 2, data_line, ["cuda_graphs: false"]),
    }
    results = []
    for name in names:
        t0 = time.perf_counter()
        try:
            r = runs[name]()
            print("%-14s done in %.1f s" % (name, time.perf_counter() - t0), flush=True)
        except Exception as e:  # one variant failing leaves the others' figures
            print("%-14s FAILED after %.1f s: %s" % (name, time.perf_counter() - t0, e), flush=True)
            lines = [l for l in str(e).splitlines() if l.strip()]  # the last line: the error itself
            r = {"error": lines[-1].strip() if lines else type(e).__name__, "epochs": []}
            r["note"] = r["error"]
        results.append((name, r))
        write_outputs(args, results, final=False)
    write_outputs(args, results, final=True)
    return 0 if all("error" not in r for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
