#!/usr/bin/env python3
"""PyTorch's own figures for the benchmark's workloads (../shared/BENCHMARKS.md).

Runs W1 (ResNet50, torchvision layout, batch 120 of 3x128x128, MSE against
one-hot labels, SGD lr 0.001, fp32) or W2 (GPT decoder, 1.34 B parameters,
bf16, SGD lr 1e-3, cross-entropy on random tokens, batch 32 x 1024) in PyTorch,
under one or more of these schedules:

  single       the whole model on cuda:0, one process          -> pytorch-1gpu
  naive        the stages on cuda:0..R-1 in one process, the
               whole batch at once (naive model parallel)       -> torch-naive-mp
  tutorial     the same, the batch cut into M micro-batches
               and issued stage by stage as the seed tutorial's
               pipelined class does (split_size = batch / M)    -> torch-split-m<M>
  gpipe, 1f1b  torch.distributed.pipelining: R processes, one
               GPU each, NCCL, one stage per process             -> torch-pp-<schedule>-m<M>
  interleaved  ScheduleInterleaved1F1B, 2 stages per process     -> torch-pp-interleaved-m<M>
  interleaved-zb  ScheduleInterleavedZeroBubble (backward split into
               input and weight passes), 2 stages per process,
               stage s on rank s % R                             -> torch-pp-interleaved-zb-m<M>
  zbv          ScheduleZBVZeroBubble, 2 stages per process in a V:
               stage s on rank s for s < R, else on 2R-1-s (the
               first rank holds the first and the last stage and
               passes both the input and the target)             -> torch-pp-zbv-m<M>
  dualpipev    ScheduleDualPipeV, the same V placement            -> torch-pp-dualpipev-m<M>

The stage modules are built by hand from the model's units (no tracing):
W1's units are the stem (conv1, bn1, relu, maxpool), the 16 bottlenecks and
the head (avgpool, flatten, fc); with 2 stages the cut is the seed's, between
layer2 and layer3. W2's units are the embedding, the 24 blocks and the head
(final norm and output layer); with 2 stages the cut is 13 | 13. Other stage
counts cut the units evenly by count, or where --boundaries says.

Prints one JSON line per configuration on stdout (everything else goes to
stderr): ms_per_iter is the mean of the timed iterations after warm-up, run
back to back between two device synchronizes (for the pipelined runs, every
rank synchronized and met at a barrier before the first, and the slowest
rank's window): the clock of Conveyor's steady rate, which counts the steps the
device finished between two points at which it had finished them
(common/steady_rate.h). `statistic` says so in each line.

--replicas R (pipelined schedules) runs R copies of the pipeline, R x --ranks processes: copy k
on ranks [k*ranks, (k+1)*ranks), each on its share [k*B/R, (k+1)*B/R) of the global batch cut
into M micro-batches, every stage module wrapped in DistributedDataParallel over the copies'
ranks of its stage (the composition torch.distributed.pipelining supports: its stages run the
module's backward under no_sync until the step's last micro-batch), or with --dp allreduce each
gradient all-reduced (averaged) over those ranks after the schedule's step. Conveyor's
`replicas: R` with `partition: {stages: ranks}` is the same layout.

--batch B runs every configuration at global batch B instead of the
workload's (W1 120, W2 32); each micro-batch count must divide B, and the
variants' names then end in -bB (as torch_single.py's --batch does).

usage: torch_pipelining.py w2 --schedules 1f1b,gpipe --micro-batches 4,8 [--batch B] [--steps 10] [--warmup 3]
                           [--ranks 2] [--replicas 1 [--dp ddp|allreduce]]
"""
import argparse
import datetime
import gc
import json
import os
import socket
import sys
import time

WORKLOADS = {
    # batch, what a sample counts as, units per sample, learning rate
    "w1": {"batch": 120, "unit": "images", "per_sample": 1, "lr": 0.001},
    "w2": {"batch": 32, "unit": "tokens", "per_sample": 1024, "lr": 1e-3},
}
LOCAL = ("single", "naive", "tutorial")
PIPELINED = ("gpipe", "1f1b", "interleaved", "interleaved-zb", "zbv", "dualpipev")
# Schedules with --chunks (interleaved) or two (V) stages per process; V ones place them in a V.
MULTI = ("interleaved", "interleaved-zb", "zbv", "dualpipev")
V_SHAPED = ("zbv", "dualpipev")
GPT = {"vocab": 32000, "width": 2048, "blocks": 24, "heads": 16, "mlp": 8192, "seq": 1024}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- models

def gpt_units(lo, hi, device):
    """W2's units lo..hi-1 (0: embedding, 1..24: blocks, 25: norm + output layer), bf16, on device."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    V, W, H, M, T = GPT["vocab"], GPT["width"], GPT["heads"], GPT["mlp"], GPT["seq"]

    class Embedding(nn.Module):
        def __init__(s):
            super().__init__()
            s.tok = nn.Embedding(V, W)
            s.pos = nn.Embedding(T, W)

        def forward(s, x):
            return s.tok(x) + s.pos(torch.arange(x.shape[1], device=x.device))

    class Block(nn.Module):
        def __init__(s):
            super().__init__()
            s.n1 = nn.LayerNorm(W)
            s.qkv = nn.Linear(W, 3 * W)
            s.proj = nn.Linear(W, W)
            s.n2 = nn.LayerNorm(W)
            s.fc1 = nn.Linear(W, M)
            s.fc2 = nn.Linear(M, W)

        def forward(s, x):
            b, t, w = x.shape
            q, k, v = s.qkv(s.n1(x)).view(b, t, 3, H, w // H).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + s.proj(a.transpose(1, 2).reshape(b, t, w))
            return x + s.fc2(F.gelu(s.fc1(s.n2(x))))

    class Head(nn.Module):
        def __init__(s):
            super().__init__()
            s.norm = nn.LayerNorm(W)
            s.out = nn.Linear(W, V)

        def forward(s, x):
            return s.out(s.norm(x))

    n = GPT["blocks"] + 2
    units = []
    with torch.device(device):
        for i in range(lo, hi):
            units.append(Embedding() if i == 0 else Head() if i == n - 1 else Block())
    return nn.Sequential(*units).to(torch.bfloat16)


def resnet50(num_classes=1000):
    """torchvision's resnet50, or the same layout in plain torch where torchvision is absent."""
    try:
        import torchvision
        return torchvision.models.resnet50(num_classes=num_classes)
    except ImportError:
        pass
    import torch.nn as nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(s, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            s.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            s.bn1 = nn.BatchNorm2d(planes)
            s.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            s.bn2 = nn.BatchNorm2d(planes)
            s.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            s.bn3 = nn.BatchNorm2d(planes * 4)
            s.relu = nn.ReLU(inplace=True)
            s.downsample = downsample

        def forward(s, x):
            identity = x if s.downsample is None else s.downsample(x)
            out = s.relu(s.bn1(s.conv1(x)))
            out = s.relu(s.bn2(s.conv2(out)))
            return s.relu(s.bn3(s.conv3(out)) + identity)

    class ResNet50(nn.Module):
        def __init__(s):
            super().__init__()
            s.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            s.bn1 = nn.BatchNorm2d(64)
            s.relu = nn.ReLU(inplace=True)
            s.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            inplanes = 64
            for i, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
                stride = 1 if i == 0 else 2
                down = None
                if stride != 1 or inplanes != planes * 4:
                    down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                                         nn.BatchNorm2d(planes * 4))
                layers = [Bottleneck(inplanes, planes, stride, down)]
                inplanes = planes * 4
                layers += [Bottleneck(inplanes, planes) for _ in range(1, blocks)]
                setattr(s, "layer%d" % (i + 1), nn.Sequential(*layers))
            s.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            s.fc = nn.Linear(2048, num_classes)
            for m in s.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

    return ResNet50()


def resnet_units(lo, hi, device):
    """W1's units lo..hi-1 (0: stem, 1..16: bottlenecks, 17: avgpool, flatten, fc), fp32, on device."""
    import torch
    import torch.nn as nn
    with torch.device(device):
        r = resnet50()
    units = [nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool)]
    for layer in (r.layer1, r.layer2, r.layer3, r.layer4):
        units += list(layer)
    units.append(nn.Sequential(r.avgpool, nn.Flatten(1), r.fc))
    return nn.Sequential(*units[lo:hi]).to(device)


NUM_UNITS = {"w1": 18, "w2": GPT["blocks"] + 2}
SEED_CUT = {"w1": 8, "w2": 13}  # with 2 stages: conv1 .. layer2 | layer3 .. fc; 13 | 13


def stage_bounds(workload, stages, boundaries=None):
    n = NUM_UNITS[workload]
    if boundaries and len(boundaries) == stages - 1:
        cuts = list(boundaries)
    elif stages == 2:
        cuts = [SEED_CUT[workload]]
    else:
        cuts = [s * n // stages for s in range(1, stages)]
    edges = [0] + cuts + [n]
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError("bad stage boundaries %s for %d units" % (cuts, n))
    return list(zip(edges, edges[1:]))


def build_stage(workload, lo, hi, device, seed, channels_last=False):
    import torch
    torch.manual_seed(seed)
    mod = (resnet_units if workload == "w1" else gpt_units)(lo, hi, device)
    return mod.to(memory_format=torch.channels_last) if channels_last else mod


def make_batch(workload, input_device, target_device, channels_last=False, batch=None):
    """A step's inputs and targets (batch: the workload's unless given)."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    B = batch or WORKLOADS[workload]["batch"]
    if workload == "w1":
        x = torch.randn(B, 3, 128, 128, device=input_device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = F.one_hot(torch.randint(1000, (B,), device=target_device), 1000).float()
    else:
        x = torch.randint(GPT["vocab"], (B, GPT["seq"]), device=input_device)
        y = torch.randint(GPT["vocab"], (B, GPT["seq"]), device=target_device)
    return x, y


def loss_fn(workload):
    import torch.nn.functional as F
    if workload == "w1":
        return F.mse_loss
    return lambda out, y: F.cross_entropy(out.flatten(0, 1).float(), y.flatten())


# ---------------------------------------------------------------- configurations

def variant_name(schedule, m):
    if schedule == "single":
        return "pytorch-1gpu"
    if schedule == "naive":
        return "torch-naive-mp"
    if schedule == "tutorial":
        return "torch-split-m%d" % m
    return "torch-pp-%s-m%d" % (schedule, m)


def global_batch(opts):
    """Samples per step: --batch, else the workload's."""
    return opts.batch or WORKLOADS[opts.workload]["batch"]


def run_name(opts, schedule, m):
    """The variant's name in the JSON lines: with --replicas R a pipelined one ends in -rR, and
    with --batch in -bB, so that runs of several batches do not share names (bench.py merges
    CSVs by name)."""
    copies = "-r%d" % opts.replicas if schedule in PIPELINED and opts.replicas > 1 else ""
    return variant_name(schedule, m) + copies + ("-b%d" % opts.batch if opts.batch else "")


def configurations(opts):
    """(schedule, micro_batches, stages, error or None) for each run asked for."""
    out = []
    batch = global_batch(opts)
    for s in opts.schedules:
        for m in ([1] if s in ("single", "naive") else opts.micro_batches):
            stages = 1 if s == "single" else opts.ranks * (stages_per_rank(opts, s) if s in PIPELINED else 1)
            err = None
            copies = opts.replicas if s in PIPELINED else 1
            if batch % copies:
                err = "batch %d does not split evenly over %d replicas" % (batch, copies)
            elif (batch // copies) % m:
                err = "a replica's batch %d does not split into %d equal micro-batches" % (batch // copies, m)
            elif s in ("interleaved", "interleaved-zb") and m % opts.ranks:
                err = "%s wants micro-batches a multiple of the ranks (%d)" % (s, opts.ranks)
            elif s in PIPELINED and m < opts.ranks:
                err = "fewer micro-batches (%d) than ranks (%d)" % (m, opts.ranks)
            out.append((s, m, stages, err))
    return out


def stages_per_rank(opts, schedule):
    """Stages a process holds: --chunks under the interleaved schedules, two under the V ones, else one."""
    if schedule in V_SHAPED:
        return 2
    return opts.chunks if schedule in MULTI else 1


def stage_rank(schedule, s, world):
    """The rank (within a pipeline) that holds stage s: in a V (s on s for s < world, else 2*world-1-s) or
    round robin (s % world: one stage per rank, or the interleaved layout)."""
    if schedule in V_SHAPED:
        return s if s < world else 2 * world - 1 - s
    return s % world


def result(opts, schedule, m, stages, times=None, error=None, **extra):
    w, batch = WORKLOADS[opts.workload], global_batch(opts)
    r = {"workload": opts.workload, "variant": run_name(opts, schedule, m), "schedule": schedule,
         "micro_batches": m, "stages": stages,
         "ranks": 1 if schedule in LOCAL else opts.ranks,
         "gpus": 1 if schedule == "single" else opts.ranks, "batch": batch, "unit": w["unit"]}
    if schedule in PIPELINED and opts.replicas > 1:  # R copies of the pipeline, their gradients averaged
        r.update({"replicas": opts.replicas, "gpus": opts.ranks * opts.replicas, "dp": opts.dp})
    if times:  # (mean seconds per step, steps timed): timed()'s window
        mean, n = times
        r.update({"ms_per_iter": round(1000 * mean, 3), "iters": n, "warmup": opts.warmup,
                  "statistic": statistic(n, opts.warmup), "samples_per_second": round(batch / mean, 3),
                  "throughput": round(batch * w["per_sample"] / mean, 1)})
    if error:
        r["error"] = error
    r.update(extra)
    return r


def emit(r):
    print(json.dumps(r), flush=True)


def statistic(steps, warmup):
    """The words every row of the benchmarks gives for its clock (bench.py's `statistic` column)."""
    return "mean of %d steps after %d warm-up, device finished at both ends" % (steps, warmup)


def window(step, sync, warmup, steps, barrier=None):
    """Mean seconds per step of `steps` steps run back to back after `warmup` untimed ones, timed
    from a point at which the device had finished every earlier step (`sync`, then `barrier` where
    several processes start together) to one at which it finished the last: the same clock as
    Conveyor's steady rate, so that launches overlapping the previous step's device work count on
    both sides alike."""
    for _ in range(warmup):
        step()
    sync()
    if barrier:
        barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def captured(step, eager_steps, stream=None):
    """PyTorch's whole-network capture recipe: `eager_steps` steps on a side stream, then the step
    captured once as a CUDA graph; returns the graph's replay. With `stream` (DDP's, which it was made
    on) the warm-up and the capture both run on it; else the warm-up on a new stream and the capture
    on torch.cuda.graph's own."""
    import torch
    side = stream or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(eager_steps):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    return graph.replay


def timed(step, devices, opts, barrier=None):
    """window() over `devices`: (mean seconds per step, steps timed)."""
    import torch

    def sync():
        for d in devices:
            torch.cuda.synchronize(d)
    return window(step, sync, opts.warmup, opts.steps, barrier), opts.steps


def profile_step(step, devices, opts, name):
    """With --profile-dir: one more step under torch.profiler, as NAME.json (Chrome trace)."""
    if not opts.profile_dir:
        return
    import torch
    from torch.profiler import ProfilerActivity, profile
    os.makedirs(opts.profile_dir, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        for d in devices:
            torch.cuda.synchronize(d)
    prof.export_chrome_trace(os.path.join(opts.profile_dir, name + ".json"))


def peak_gib(devices):
    import torch
    return [round(torch.cuda.max_memory_allocated(d) / 2 ** 30, 2) for d in devices]


# ---------------------------------------------------------------- one process: single, naive, tutorial

def wavefront(mods, devices, chunks):
    """The seed tutorial's PipelineParallelResNet50.forward, for any stage count: at each
    tick, later stages take their next micro-batch before earlier ones, so that the
    launches on one device overlap the work queued on the others."""
    import torch
    n, m = len(mods), len(chunks)
    held = [dict() for _ in mods]  # held[s][i]: stage s's output for micro-batch i
    outs = []
    for tick in range(m + n - 1):
        for s in reversed(range(n)):
            i = tick - s
            if 0 <= i < m:
                src = chunks[i] if s == 0 else held[s - 1].pop(i)
                h = mods[s](src.to(devices[s]))
                if s == n - 1:
                    outs.append(h)
                else:
                    held[s][i] = h
    return torch.cat(outs)


def local_worker(_index, opts, configs):
    import torch
    torch.backends.cudnn.benchmark = opts.channels_last
    w = opts.workload
    lossf = loss_fn(w)
    built = {}
    for schedule, m, stages, _ in configs:
        devices = [torch.device("cuda", i) for i in range(stages)]
        try:
            if stages not in built:
                built.clear()
                torch.cuda.empty_cache()
                bounds = stage_bounds(w, stages, opts.boundaries)
                built[stages] = [build_stage(w, lo, hi, devices[i], 1000 + i, opts.channels_last)
                                 for i, (lo, hi) in enumerate(bounds)]
            mods = built[stages]
            params = [p for mod in mods for p in mod.parameters()]
            opt = torch.optim.SGD(params, lr=WORKLOADS[w]["lr"])
            x, y = make_batch(w, devices[0], devices[-1], opts.channels_last, opts.batch)
            last = {}

            def forward(chunk):
                for i, mod in enumerate(mods):
                    chunk = mod(chunk.to(devices[i]))
                return chunk

            def step():
                opt.zero_grad(set_to_none=True)
                if schedule == "tutorial":
                    out = wavefront(mods, devices, x.chunk(m))
                else:
                    out = forward(x)
                loss = lossf(out, y)
                loss.backward()
                opt.step()
                last["loss"] = loss

            for d in devices:
                torch.cuda.reset_peak_memory_stats(d)
            times = timed(step, devices, opts)
            profile_step(step, devices, opts, run_name(opts, schedule, m))
            emit(result(opts, schedule, m, stages, times, loss=round(float(last["loss"].detach()), 5),
                        peak_gib=peak_gib(devices)))
        except torch.cuda.OutOfMemoryError as e:
            emit(result(opts, schedule, m, stages, error="out of memory: %s" % str(e).splitlines()[0]))
            built.clear()
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- R processes: torch.distributed.pipelining

def replica_groups(dist, ranks, replicas):
    """(pipeline groups, data-parallel groups) of R x ranks processes: pipeline k holds ranks
    [k*ranks, (k+1)*ranks); data-parallel group p the ranks of stage rank p in every copy. Every
    process makes every group, in the same order, as new_group demands. None where R is 1."""
    if replicas == 1:
        return None, None
    pp = [dist.new_group(list(range(k * ranks, (k + 1) * ranks))) for k in range(replicas)]
    dp = [dist.new_group(list(range(p, ranks * replicas, ranks))) for p in range(ranks)]
    return pp, dp


def average_gradients(dist, params, group, copies):
    """--dp allreduce: each gradient summed over the copies and divided by their count, after the
    schedule's step (DDP's result, without its overlap with the last backward)."""
    import torch
    grads = [p.grad for p in params if p.grad is not None]
    for w in [dist.all_reduce(g, group=group, async_op=True) for g in grads]:
        w.wait()
    torch._foreach_div_(grads, float(copies))


def pp_worker(rank, opts, configs, port):
    import inspect
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining import PipelineStage
    from torch.nn.parallel import DistributedDataParallel
    # By name: a PyTorch without one of them fails only that schedule's rows.
    classes = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
               "interleaved-zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
               "dualpipev": "ScheduleDualPipeV"}
    world, copies = opts.ranks, opts.replicas
    copy, prank = rank // world, rank % world  # which pipeline, and the rank within it
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if opts.netns:  # each rank a "host" of its own (bench/gpu/hosts.sh): its namespace, rank 0's address
        namespaces, _, master = opts.netns.partition("@")
        with open("/run/netns/" + namespaces.split(",")[rank]) as ns:
            os.setns(ns.fileno(), os.CLONE_NEWNET)
        os.environ["MASTER_ADDR"] = master
    torch.cuda.set_device(rank)
    torch.backends.cudnn.benchmark = opts.channels_last
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world * copies,
                            timeout=datetime.timedelta(seconds=opts.nccl_timeout))
    pp_groups, dp_groups = replica_groups(dist, world, copies)
    pp_group = pp_groups[copy] if pp_groups else None
    dp_group = dp_groups[prank] if dp_groups else None
    w = opts.workload
    lossf = loss_fn(w)
    x, y = make_batch(w, dev, dev, opts.channels_last, opts.batch)
    share = x.shape[0] // copies  # this copy's contiguous share of the global batch
    x, y = x[copy * share:(copy + 1) * share], y[copy * share:(copy + 1) * share]
    layouts = {}
    try:
        for schedule, m, stages, _ in configs:
            key = (stages, schedule in V_SHAPED)
            if key not in layouts:
                layouts.clear()  # one layout's modules at a time on the GPU
                gc.collect()
                torch.cuda.empty_cache()
                bounds = stage_bounds(w, stages, opts.boundaries)
                layouts[key] = [(s, build_stage(w, lo, hi, dev, 1000 + s, opts.channels_last))
                                for s, (lo, hi) in enumerate(bounds) if stage_rank(schedule, s, world) == prank]
            mine = layouts[key]
            # Under --dp ddp each stage module is wrapped; device_ids stays None (a one-device module),
            # so that DDP moves no inputs (the stages infer their shapes on meta tensors).
            wrapped = [(s, DistributedDataParallel(mod, process_group=dp_group)
                        if dp_group is not None and opts.dp == "ddp" else mod) for s, mod in mine]
            pstages = [PipelineStage(mod, s, stages, dev, group=pp_group) for s, mod in wrapped]
            cls = getattr(pipelining, classes[schedule], None)
            if cls is None:
                raise RuntimeError("torch %s has no %s" % (torch.__version__, classes[schedule]))
            sched = cls(pstages if schedule in MULTI else pstages[0], n_microbatches=m, loss_fn=lossf)
            kw = {}
            if "return_outputs" in inspect.signature(sched.step).parameters:
                kw["return_outputs"] = False
            params = [p for _, mod in mine for p in mod.parameters()]
            opt = torch.optim.SGD(params, lr=WORKLOADS[w]["lr"])
            losses = []

            def step():
                opt.zero_grad(set_to_none=True)
                losses.clear()
                if schedule in V_SHAPED and prank == 0:  # the first and the last stage
                    sched.step(x, target=y, losses=losses, **kw)
                elif prank == 0:
                    sched.step(x, **kw)
                elif prank == world - 1:
                    sched.step(target=y, losses=losses, **kw)
                else:
                    sched.step(**kw)
                if dp_group is not None and opts.dp == "allreduce":
                    average_gradients(dist, params, dp_group, copies)
                opt.step()

            torch.cuda.reset_peak_memory_stats(dev)
            dist.barrier()
            mean, n = timed(step, [dev], opts, barrier=dist.barrier)
            profile_step(step, [dev], opts, "%s-rank%d" % (run_name(opts, schedule, m), rank))
            t = torch.tensor([mean], device=dev, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the window lasts as long as its slowest rank's
            loss = torch.tensor([float(sum(l.detach().float() for l in losses) / len(losses)) if losses else 0.0],
                                device=dev)
            dist.all_reduce(loss)  # each copy's last rank's mean loss: their mean over the copies
            loss /= copies
            mem = torch.zeros(world * copies, device=dev)
            mem[rank] = torch.cuda.max_memory_allocated(dev) / 2 ** 30
            dist.all_reduce(mem)
            if rank == 0:
                emit(result(opts, schedule, m, stages, (t.item(), n), loss=round(loss.item(), 5),
                            peak_gib=[round(v, 2) for v in mem.tolist()]))
            del sched, pstages, wrapped, opt, step
            gc.collect()
            torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, args, nprocs, deadline):
    """Run fn in nprocs fresh processes; False if they failed or outlived the deadline (then they are killed)."""
    import torch.multiprocessing as mp
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    try:
        while not ctx.join(timeout=2):
            if time.time() > deadline:
                log("torch_pipelining: past the deadline, stopping the workers")
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                return False
        return True
    except Exception as e:  # a worker raised: spawn has already ended the others
        log("torch_pipelining: a worker failed: %s" % str(e).strip().splitlines()[-1:])
        log(str(e))
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=sorted(WORKLOADS))
    p.add_argument("--schedules", default="single,gpipe,1f1b",
                   help="comma-separated, of: " + ", ".join(LOCAL + PIPELINED))
    p.add_argument("--micro-batches", default=None, help="comma-separated micro-batch counts "
                   "(default: 2,4,6 for w1, 4,8,16 for w2)")
    p.add_argument("--batch", type=int, default=0,
                   help="global batch of every configuration (default: the workload's, W1 120, W2 32); "
                        "the micro-batch counts must divide it; names then end in -bB")
    p.add_argument("--steps", type=int, default=10, help="timed iterations per configuration")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument("--ranks", type=int, default=2, help="processes (GPUs) of the pipelined and naive runs")
    p.add_argument("--chunks", type=int, default=2, help="stages per rank under interleaved")
    p.add_argument("--replicas", type=int, default=1,
                   help="copies of each pipelined run, each on --ranks GPUs of its own and its share of the batch")
    p.add_argument("--dp", choices=("ddp", "allreduce"), default="ddp",
                   help="with --replicas: DistributedDataParallel around each stage module, or the gradients "
                        "all-reduced after the schedule's step")
    p.add_argument("--boundaries", default=None,
                   help="unit indices where stages start, for the layout with that many stages "
                        "(w1: 18 units, w2: 26 units)")
    p.add_argument("--timeout", type=int, default=540, help="seconds for the whole run; workers are killed then")
    p.add_argument("--nccl-timeout", type=int, default=300)
    p.add_argument("--netns", default=None, metavar="NS0,NS1,...@ADDRESS",
                   help="run pipelined rank i in network namespace NSi (/run/netns), rank 0 reached at ADDRESS "
                        "(bench/gpu/hosts.sh; Python 3.12's os.setns)")
    p.add_argument("--profile-dir", default=None,
                   help="after the timed steps, profile one more with torch.profiler: DIR/VARIANT[-rankR].json")
    p.add_argument("--channels-last", action="store_true",
                   help="parameters and inputs in channels-last memory, and cudnn.benchmark on")
    p.add_argument("--list", action="store_true", help="print the configurations and exit (needs no torch)")
    opts = p.parse_args()
    opts.schedules = [s for s in opts.schedules.split(",") if s]
    if opts.batch < 0:
        p.error("--batch: a positive count of samples")
    if opts.replicas < 1:
        p.error("--replicas: at least 1")
    for s in opts.schedules:
        if s not in LOCAL + PIPELINED:
            p.error("unknown schedule %r" % s)
    mb = opts.micro_batches or ("2,4,6" if opts.workload == "w1" else "4,8,16")
    opts.micro_batches = [int(v) for v in mb.split(",") if v]
    opts.boundaries = [int(v) for v in opts.boundaries.split(",")] if opts.boundaries else None
    configs = configurations(opts)
    if opts.list:
        for s, m, stages, err in configs:
            print("%-26s stages=%d%s" % (run_name(opts, s, m), stages, "  (skipped: %s)" % err if err else ""))
        return 0

    deadline = time.time() + opts.timeout
    # NVLink multicast stays off (on shared machines it can take the GPUs out of service).
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    for s, m, stages, err in configs:
        if err:
            emit(result(opts, s, m, stages, error=err))
    configs = [c for c in configs if not c[3]]
    try:
        import torch
    except ImportError:
        for s, m, stages, _ in configs:
            emit(result(opts, s, m, stages, error="python3 cannot import torch"))
        return 2
    gpus = torch.cuda.device_count()
    log("torch %s, %d GPU(s), workload %s" % (torch.__version__, gpus, opts.workload))
    ok = True
    local = [c for c in configs if c[0] in LOCAL]
    piped = [c for c in configs if c[0] in PIPELINED]
    for group, need in ((local, max([c[2] for c in local] or [0])), (piped, opts.ranks * opts.replicas)):
        if not group:
            continue
        if gpus < need:
            for s, m, stages, _ in group:
                emit(result(opts, s, m, stages, error="needs %d GPUs, %d found" % (need, gpus)))
            ok = False
        elif group is local:
            ok &= spawn(local_worker, (opts, group), 1, deadline)
        else:
            ok &= spawn(pp_worker, (opts, group, free_port()), opts.ranks * opts.replicas, deadline)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
