"""bench.py's workloads, ../shared/BENCHMARKS.md's W1 and W2 (their example jobs, units, micro-batch
sweeps and model FLOPs), and the plan of variants a run measures, with each Conveyor variant's job text."""
import fnmatch
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

import torch_pipelining as tp  # noqa: E402  (imports no torch at module level)
import torch_single as tsingle  # noqa: E402  (the same)


JOBS = {"w1": "examples/resnet50-w1.yaml", "w2": "examples/gpt-w2.yaml"}


UNITS = {w: (v["unit"], v["per_sample"]) for w, v in tp.WORKLOADS.items()}


DEFAULT_MICRO_BATCHES = {"w1": "2,4,6,12", "w2": "4,8,16"}


# W1 as the seed's code runs it: NCHW, cuDNN's default algorithms (the -nchw variants).
NCHW = ["memory_format=contiguous", "cudnn_benchmark=false"]


# `bench.py sizes`: each workload's full batch and a pipeline stage's micro-batches.
SIZES = {"w1": "120,60", "w2": "32,8,4"}


SCHEDULE_ORDER = ["", "single", "naive", "tutorial", "gpipe", "1f1b", "interleaved", "interleaved-zb", "zbv",
                  "dualpipev", "zero-bubble"]


WARMUP = 2  # Conveyor's steady rate leaves out the first 2 steps (common/job_spec.h kWarmupSteps)


# Model FLOPs utilisation (W2 rows): the model's FLOPs a step over (seconds a step x GPUs x the bf16 peak).
# The peak is the dense bf16 tensor-core figure of both the H100 SXM and the H200 (989.4 TFLOP/s).
BF16_PEAK_FLOPS = 989.4e12


def w2_model_flops(batch):
    """W2's model FLOPs for one training step on `batch` sequences (bench/README.md): per token
    6 N for the matrix products of forward and backward (N: the weights that multiply, 24 blocks of
    12 W^2 and the W x V output layer; the embedding is a lookup), and 12 L T W for attention's two
    products (QK^T and AV, forward and backward, counted over the full T x T square as PaLM's
    appendix does, though the causal kernel computes about half of it)."""
    g = tp.GPT
    W, L, T, V = g["width"], g["blocks"], g["seq"], g["vocab"]
    n = L * (3 * W * W + W * W + 2 * W * g["mlp"]) + W * V
    return batch * T * (6 * n + 12 * L * T * W)


def mfu(workload, batch, ms, gpus):
    """A row's model FLOPs utilisation as a fraction, or None (W1 is not counted)."""
    if workload != "w2" or not ms or not gpus:
        return None
    return w2_model_flops(batch) / (ms / 1000.0 * gpus * BF16_PEAK_FLOPS)


def plan(args):
    """Every variant the arguments ask for: dicts with variant, impl, schedule, m."""
    mbs = [int(x) for x in args.micro_batches.split(",") if x]
    # PyTorch at its best on one GPU (bench/torch_single.py): channels-last with cuDNN autotuning
    # (W1), the whole step as one CUDA graph, torch.compile.
    best = [{"variant": n, "impl": "pytorch", "schedule": "best", "m": 1}
            for n in tsingle.VARIANTS[1:] if n != "pytorch-1gpu-cl" or args.workload == "w1"]
    # Conveyor's single device: its defaults (W1: channels-last and cuDNN autotuning on CUDA), and W1 as
    # the seed's code runs it (NCHW, no autotuning).
    single = [{"variant": "conveyor-1dev", "impl": "conveyor", "schedule": "", "m": 1},
              # Without the multi-tensor SGD step: LibTorch's loop of kernels per tensor.
              {"variant": "conveyor-1dev-loop", "impl": "conveyor", "schedule": "", "m": 1,
               "set": ["optimizer.foreach=false"]},
              # Forward, loss and backward replayed as CUDA graphs (cuda_graphs) from the second step.
              {"variant": "conveyor-1dev-graphs", "impl": "conveyor", "schedule": "", "m": 1, "graphs": True},
              # Without them: cuda_graphs' default (auto) is on for the reference.
              {"variant": "conveyor-1dev-eager", "impl": "conveyor", "schedule": "", "m": 1,
               "set": ["cuda_graphs=false"]}]
    if args.workload == "w1":
        single.append({"variant": "conveyor-1dev-nchw", "impl": "conveyor", "schedule": "", "m": 1,
                       "set": NCHW})
    else:  # without the fused qkv split: unbind's backward (a stack and a copy)
        single.append({"variant": "conveyor-1dev-unfused", "impl": "conveyor", "schedule": "", "m": 1,
                       "set": ["model.fused=false"]})
    if args.batch:  # a pipeline stage's micro-batch: the single-device variants only
        out = [{"variant": "pytorch-1gpu", "impl": "pytorch", "schedule": "best", "m": 1}] + best + single + \
              [{"variant": "conveyor-1stage-graphs", "impl": "conveyor", "schedule": "gpipe", "m": 1,
                "graphs": True, "stages": 1}]
        for v in out:
            v["variant"] += batch_suffix(args)
        return select(args, out)
    out = [{"variant": "pytorch-1gpu", "impl": "pytorch", "schedule": "single", "m": 1}] + best + \
          [{"variant": "torch-naive-mp", "impl": "pytorch", "schedule": "naive", "m": 1}]
    for s in args.torch_schedules:
        for m in mbs:
            out.append({"variant": tp.variant_name(s, m), "impl": "pytorch", "schedule": s, "m": m})
    out += single
    # The whole model on one stage server (against the reference, conveyor-1dev). W2's
    # without graphs: the reference trains it eagerly at batch 32 (its graphs do not fit beside the eager
    # first step), and a stage server has no such fallback.
    out.append({"variant": "conveyor-1stage", "impl": "conveyor", "schedule": "gpipe", "m": 1, "stages": 1,
                "set": ["cuda_graphs=false"] if args.workload == "w2" else []})
    out.append({"variant": "naive-mp", "impl": "conveyor", "schedule": "naive", "m": 1})
    for s in args.schedules:
        for m in mbs:
            out.append({"variant": "%s-m%d" % (s, m), "impl": "conveyor", "schedule": s, "m": m})
    if args.graphs:  # the same stage servers replaying CUDA graphs
        out += [dict(v, variant=v["variant"] + "-graphs", graphs=True) for v in out
                if v["impl"] == "conveyor" and not v["variant"].startswith("conveyor-1dev")]
        out.append({"variant": "conveyor-1stage-graphs", "impl": "conveyor", "schedule": "gpipe", "m": 1,
                    "graphs": True, "stages": 1})
    for v in out:  # --replicas R: the pipelines R times over (-rR); --global-batch: names end in -bB
        if args.replicas > 1 and pipelined(v):
            v["variant"] += "-r%d" % args.replicas
        v["variant"] += batch_suffix(args)
    return select(args, out)


def pipelined(v):
    """Whether a variant runs stages on several GPUs: what --replicas copies."""
    if v["impl"] == "pytorch":
        return v["schedule"] in tp.PIPELINED
    return v["schedule"] not in ("", "single") and v.get("stages") != 1


def select(args, out):
    only = [p for p in (args.only or "").split(",") if p]
    skip = [p for p in (args.skip or "").split(",") if p]
    match = lambda name, patterns: any(fnmatch.fnmatch(name, p) for p in patterns)
    return [v for v in out if (not only or match(v["variant"], only)) and not match(v["variant"], skip)
            and not (args.no_pytorch and v["impl"] == "pytorch")]


def job_text(workload, steps, schedule=None, micro_batches=None, extra=(), stages=2):
    text = open(os.path.join(ROOT, JOBS[workload])).read()
    if stages != 2:  # the examples cut the model in two
        text = re.sub(r"(?m)^(partition: \{stages: )2", r"\g<1>%d" % stages, text)
    for kv in extra:  # --set KEY=VALUE: replaces the key or adds it
        key, _, value = kv.partition("=")
        line = "%s: %s" % (key.strip(), value.strip())
        text, n = re.subn(r"(?m)^%s: .*$" % re.escape(key.strip()), line, text)
        if not n:
            text += line + "\n"
    text = re.sub(r"(?m)^steps: .*$", "steps: %d" % steps, text)
    if schedule:
        text = re.sub(r"(?m)^schedule: .*$", "schedule: %s" % schedule, text)
        if schedule == "interleaved" and not re.search(r"(?m)^virtual_stages:", text):
            text += "virtual_stages: 2\n"  # two model chunks per stage (GPU), unless --set says
    if micro_batches:
        text = re.sub(r"(?m)^(micro_batches|split_size): .*$", "micro_batches: %d" % micro_batches, text)
    return text


def asked_batch(args):
    """--batch or --global-batch: the batch every variant of the run trains on; 0 if neither."""
    return args.batch or args.global_batch


def batch_suffix(args):
    """-bB with --batch or --global-batch: the end of the run's names, CSV and logs."""
    return "-b%d" % asked_batch(args) if asked_batch(args) else ""


def job_integer(workload, pattern):
    """An integer of the workload's example job file: the first group of `pattern`."""
    return int(re.search(pattern, open(os.path.join(ROOT, JOBS[workload])).read()).group(1))


def batch_size(workload, args=None):
    if args is not None and asked_batch(args):
        return asked_batch(args)
    return job_integer(workload, r"(?m)^batch_size: (\d+)")


def train_samples(workload):
    return job_integer(workload, r"train_samples: (\d+)")


def base_name(variant):
    """A variant's name without the -bB of --batch and --global-batch."""
    return re.sub(r"-b\d+$", "", variant)


def row_batch(r):
    """A CSV row's global batch: its name's -bB, else its job's."""
    m = re.search(r"-b(\d+)$", r["variant"])
    return int(m.group(1)) if m else batch_size(r["workload"])
