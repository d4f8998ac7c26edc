#!/usr/bin/env python3
"""Conveyor's pipeline benchmark: the seed tutorial's comparison, grown up.

For one workload of ../shared/BENCHMARKS.md (w1: ResNet50 in two stages, the
seed experiment; w2: a 1.34 B GPT decoder in bf16) it runs, one after the
other on this machine:

  PyTorch (bench/torch_pipelining.py, through python3, where it imports torch with CUDA)
    pytorch-1gpu            the whole model on one GPU (eager, the seed's code)
  PyTorch at its best on one GPU (bench/torch_single.py)
    pytorch-1gpu-cl         W1: channels-last memory and cudnn.benchmark
    pytorch-1gpu-graph      the whole training step captured once as a CUDA graph, replayed
    pytorch-1gpu-compile    torch.compile (W1: channels-last)
    ("vs best PyTorch" is against the fastest PyTorch row of the run, whichever it is.)
  `bench.py dp` runs the seed's other comparison on R GPUs: PyTorch DDP against Conveyor with R
  replicas of one stage, each against one GPU of its kind (bench/dp_gpu.py).
  --batch B measures only the single-device variants (PyTorch's four, Conveyor's conveyor-1dev-*
  and conveyor-1stage-graphs) at batch B, a pipeline stage's micro-batch
  (W1 60; W2 8 or 4): names end in -bB. `bench.py sizes` runs them at W1's 120 and 60 and
  W2's 32, 8 and 4 in one call and prints one table of ms per step (sizes.md).
  --global-batch B runs every variant, the pipelined ones included, at global batch B (a batch
  sweep: where a pipeline starts to pay); names end in -bB as well, so that `bench.py plot`
  merges the CSVs of several batches (each row's vs_* columns then compare rows of its batch).
    torch-naive-mp          the stages on 2 GPUs in one process, no micro-batches
    torch-split-m<M>        the seed tutorial's pipelined class: M micro-batches, one process
    torch-pp-<sched>-m<M>   torch.distributed.pipelining, 2 processes (one GPU each, NCCL),
                            <sched> one of gpipe, 1f1b, interleaved (2 stages per process),
                            interleaved-zb, zbv, dualpipev (2 stages per process; the V ones place
                            stage s on rank s for s < R, else 2R-1-s: bench/torch_pipelining.py)
  Conveyor (--bin: the folder holding `conveyor`)
    conveyor-1dev           `conveyor train --reference`: Conveyor's single device, its defaults (W1 on
                            CUDA: channels-last memory and cuDNN autotuning, job keys memory_format and
                            cudnn_benchmark)
    conveyor-1dev-nchw      W1: the same as the seed's code runs it (NCHW, no autotuning)
    conveyor-1dev-loop      conveyor-1dev with optimizer.foreach: false (SGD as LibTorch's loop of
                            kernels per tensor, as before the multi-tensor step)
    conveyor-1dev-graphs    conveyor-1dev with cuda_graphs: true (forward, loss and backward replayed
                            as CUDA graphs from the second step; the default, auto, does so too)
    conveyor-1dev-eager     conveyor-1dev with cuda_graphs: false
    conveyor-1dev-unfused   W2: conveyor-1dev with model.fused: false (attention's q, k, v gradients
                            through unbind's stack and a copy, as before issue 19)
    conveyor-1stage         one stage server holding the whole model (conveyor local --stages 1): W1
                            as cuda_graphs' default (auto) has it, W2 with cuda_graphs: false (as
                            its reference trains at batch 32)
    naive-mp                stage servers, one micro-batch per step (plain model parallel)
    <sched>-m<M>            stage servers with each schedule over a sweep of micro-batch counts
    (--graphs) <variant>-graphs  each of the two above with cuda_graphs: true, and
    conveyor-1stage-graphs  one stage server holding the whole model, with cuda_graphs
  The pipelined variants use --ranks GPUs (default 2), one stage each (interleaved: 2 chunks
  per GPU); --replicas R runs R copies of each (R x ranks GPUs, names ending in -rR): Conveyor's
  `replicas: R`, PyTorch's pipelines with DDP around each stage over the copies (--dp).
  --torch-channels-last runs PyTorch's variants with channels-last memory and cudnn.benchmark
  (W1's fastest PyTorch; the seed's code is NCHW without autotuning).

It prints a table (with each row's throughput against PyTorch's single GPU,
against the best PyTorch variant of the run, against torch-pp-best (the fastest
torch.distributed.pipelining row on as many GPUs, whatever its schedule and
micro-batch count) and against Conveyor's single device; for W2 each row's
model FLOPs utilisation, bench/README.md; and each row's peak memory a GPU), writes a CSV after every variant (so a run stopped at a time limit
keeps what it measured) and, where matplotlib imports, the seed's two
pictures: a bar chart of the variants and the split-size trade-off curve.

A run can be cut into parts that each fit one time-limited call (--only and
--skip take comma-separated shell patterns over the variant names; --dry-run
lists what a run would do); `bench.py plot --csv A.csv B.csv ...` then merges
the parts' CSVs (a later file's row replaces an earlier one of the same
workload and variant) into one table, one CSV per workload and the plots.

Throughput is taken after the first 2 steps (warm-up), the same way on both
sides: the mean over the steps after them, between a point at which the device
had finished every earlier step and one at which it finished the last
(Conveyor's steady rate, common/steady_rate.h; PyTorch's steps run back to back
between two synchronizes); the `statistic` column says so. Each Conveyor row
is also checked from outside (--outside-steps, --outside-seconds): the same
variant run again for more steps, the difference of the two lengths' shortest
wall times over the difference of their steps; `outside_ms_per_step` and `outside_ratio` hold it, and a row
where the two clocks disagree by more than 5% says so in its note (CLOCKS DISAGREE), unless the difference
lies within the runs' own spread and that spread is past 5%: then the note says the outside clock was too
noisy to judge it. With --repeats N every row, PyTorch's and Conveyor's alike, is run N times and is its median
run (the `statistic` column says so); a Conveyor row's N runs are also the outside check's runs
of --steps. Each run's own clock is kept too (`runs_own_ms`; `median_step_ms`, the median of the row's
steady steps' own times, says whether a few slow steps make its mean), and `outside_same_runs_ratio` compares
the outside figure with the own clock of the long run it came from: where that agrees and the row's run
does not, the note says the row's run was off the others (run-to-run spread), not its clock. A row whose runs recovered from a failure says so too (RECOVERED): its steady clock
leaves the recovery out.

usage: bench/bench.py w1|w2 [--bin build-gpu/bin] [--out DIR] [--csv FILE] [--steps 10]
                            [--micro-batches 4,8,16] [--schedules gpipe,1f1b,zero-bubble]
                            [--torch-schedules tutorial,gpipe,1f1b,interleaved]
                            [--batch B | --global-batch B] [--only PATTERNS] [--skip PATTERNS] [--dry-run]
       bench/bench.py plot --csv A.csv [B.csv ...] [--out DIR]
       bench/bench.py sizes [--w1 120,60] [--w2 32,8,4] [--full-only PATTERNS] [--budget S] [--out DIR] [run options]
"""
import argparse
import csv
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
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
FIELDS = ["workload", "variant", "impl", "schedule", "micro_batches", "stages", "ms_per_step",
          "samples_per_second", "throughput", "unit", "vs_pytorch_1gpu", "vs_best_pytorch",
          "vs_conveyor_1dev", "vs_torch_pp_best", "gpus", "mfu", "statistic", "outside_ms_per_step", "outside_ratio", "outside_same_runs_ratio", "outside_walls", "runs_own_ms", "median_step_ms", "final_loss", "busy_fraction",
          "theoretical_idle_fraction", "peak_gib", "note"]
OUTSIDE_TOLERANCE = 0.05  # a row whose outside clock differs by more is marked
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


def clocks_disagree(ratio):
    """Whether a row's outside clock (outside / inside, as a ratio) differs from its own by more than allowed."""
    return abs(float(ratio) - 1) > OUTSIDE_TOLERANCE


# ---------------------------------------------------------------- the plan

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
              # Before the multi-tensor SGD step (issue 19): LibTorch's loop of kernels per tensor.
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
    else:  # before issue 19's qkv split: unbind's backward (a stack and a copy)
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
    # The whole model on one stage server (issue 36 item 1: against the reference, conveyor-1dev). W2's
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


# ---------------------------------------------------------------- Conveyor

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


def conveyor_command(args, v, job_path):
    exe = os.path.join(args.bin, "conveyor")
    profile = []
    if args.profile_dir:  # a folder per run: each local cluster numbers its jobs from 1
        profile = ["--profile-dir", os.path.abspath(os.path.join(args.profile_dir, "%s-%s" % (args.workload, v["variant"])))]
    if v["variant"].startswith("conveyor-1dev"):
        return [exe, "train", job_path, "--reference", "--device", args.device, "--json"] + profile
    # One stage server per stage and replica, as the row names it: `conveyor local` would fold stages
    # that outnumber the GPUs into one server per GPU (plan/placement.h).
    cmd = [exe, "local", job_path, "--json"] + profile
    if os.path.exists(job_path):  # not under --dry-run
        text = open(job_path).read()
        stages = re.search(r"(?m)^partition: \{stages: (\d+)", text)
        replicas = re.search(r"(?m)^replicas: (\d+)", text)
        cmd += ["--stages", str((int(stages.group(1)) if stages else 1) * (int(replicas.group(1)) if replicas else 1))]
    if args.trace_dir:  # the last step's timeline (device times of the compute on GPUs)
        os.makedirs(args.trace_dir, exist_ok=True)
        cmd += ["--trace", os.path.join(args.trace_dir, "%s-%s" % (args.workload, v["variant"]))]
    return cmd


def stop_stage_servers(args):
    """After a timed-out run: its stage servers get SIGTERM when `conveyor` dies, but one stuck
    on its device would go on holding it and skew every later variant. Kill what is left."""
    pattern = re.escape(os.path.join(args.bin, "stage_server"))
    left = subprocess.run(["pkill", "-KILL", "-f", pattern], capture_output=True)
    if left.returncode == 0:
        print("  killed stage servers left running (%s)" % pattern, file=sys.stderr)


def run_conveyor(args, workload, v, steps=None):
    """One run of a Conveyor variant for `steps` (default --steps): its JSON result (with `wall_s`,
    the process's wall time) and a note, or None and why not."""
    steps = steps or args.steps
    schedule = "gpipe" if v["schedule"] == "naive" else v["schedule"] or None
    micro_batches = v["m"]  # the reference trains on whole batches: 1, so that a split_size fits any --batch
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        # The last warm-up step is the one profiled: it is not timed.
        extra = args.set + (["profile_step=%d" % WARMUP] if args.profile_dir else [])
        extra += ["cuda_graphs=true"] if v.get("graphs") else []
        extra += v.get("set", [])
        extra += ["replicas=%d" % args.replicas] if args.replicas > 1 and pipelined(v) else []
        f.write(job_text(workload, steps, schedule=schedule, micro_batches=micro_batches, extra=extra,
                         stages=v.get("stages", args.ranks)))
        path = f.name
    cmd = conveyor_command(args, v, path)
    log = os.path.join(args.out, "%s-%s%s.log" % (workload, v["variant"], "" if steps == args.steps else "-%d" % steps))
    try:
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - started
    except subprocess.TimeoutExpired as e:
        print("  %s: past %d s, stopped (log: %s)" % (v["variant"], args.timeout, log), file=sys.stderr)
        with open(log, "w") as f:  # what it said before it was stopped
            f.write(e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or "")
        stop_stage_servers(args)
        return None, "timeout"
    except OSError as e:
        print("  %s: cannot run %s: %s" % (v["variant"], cmd[0], e), file=sys.stderr)
        return None, "not run"
    finally:
        os.unlink(path)
    with open(log, "w") as f:
        f.write(proc.stderr)
    result = None
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    except ValueError:
        pass
    note = ""
    if proc.returncode != 0:
        # A job can succeed and print its result before the CLI dies on the way out (seen once
        # on the GPU machine): keep the job's own figure, and say so.
        if result and result.get("state") == "succeeded":
            note = "conveyor exited %d after the job succeeded" % proc.returncode
        else:
            print("  %s failed (exit %d), see %s" % (v["variant"], proc.returncode, log), file=sys.stderr)
            return None, "exit %d" % proc.returncode
    if not result or not result.get("steady_samples_per_second"):
        print("  %s: no steady rate in its output, see %s" % (v["variant"], log), file=sys.stderr)
        return None, "no result"
    result["wall_s"] = wall
    return result, note


def median_steady_ms(r):
    """The median of a Conveyor run's steady steps' own times (its step_seconds after the warm-up), in ms, or
    None: a diagnostic beside the mean: well under it, a few slow steps make the mean. PyTorch's rows time
    one window of steps and have none."""
    steady = sorted(r.get("step_seconds", [])[WARMUP:])
    return 1000.0 * steady[len(steady) // 2] if steady else None


def median_step_ms(r):
    """median_steady_ms as the CSV's column: two decimals, or empty."""
    ms = median_steady_ms(r)
    return "%.2f" % ms if ms is not None else ""


def own_ms(workload, args, r):
    """A run's own clock, ms per step (nan where it has none)."""
    sps = r.get("steady_samples_per_second")
    return 1000.0 * batch_size(workload, args) / sps if sps else float("nan")


def repeated(args, statistic):
    """The statistic column of a row measured --repeats times: the median run's."""
    return statistic if args.repeats <= 1 else "median of %d runs, each the %s" % (args.repeats, statistic)


def median_run(runs, key):
    """The run whose `key` is the median of `runs` (the lower middle one of an even count)."""
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def outside_order(short, long_, repeats, have_short=1):
    """The runs an outside check adds, by length: `repeats` runs of `long_` and enough of `short` to
    make `repeats` with the `have_short` already run. Alternated, long first: what drifts during the
    call falls on both lengths."""
    n_short = max(0, repeats - have_short)
    order = []
    for i in range(max(repeats, n_short)):
        order += ([long_] if i < repeats else []) + ([short] if i < n_short else [])
    return order


def outside_check(args, workload, v, firsts, inside_ms):
    """The variant run again, at --outside-steps and at --steps (--outside-repeats runs of each
    length, the row's own runs `firsts` counting as runs of --steps): ms per step from the difference
    of the two lengths' shortest wall times (start-up, loading and teardown cancel; the shortest,
    since what varies from run to run there, cuDNN's autotuning, the page cache, only ever adds), and
    its ratio to the row's figure `inside_ms`."""
    more = args.outside_steps
    if more is None:  # long enough that the steps' time dwarfs what start-up varies by (seconds on W2)
        more = args.steps + max(2 * args.steps + 2, int(1000.0 * args.outside_seconds / inside_ms) + 1)
    if not more or more <= args.steps:
        return {}
    walls = {args.steps: [r["wall_s"] for r in firsts], more: []}
    clocks = {args.steps: [own_ms(workload, args, r) for r in firsts], more: []}  # each run's own clock, ms/step
    recoveries = sum(int(r.get("recoveries") or 0) for r in firsts)
    for n in outside_order(args.steps, more, args.outside_repeats, len(firsts)):
        r, _ = run_conveyor(args, workload, v, steps=n)
        if not r:
            return {"note": "outside check failed (a run of %d steps)" % n}
        walls[n].append(r["wall_s"])
        clocks[n].append(own_ms(workload, args, r))
        recoveries += int(r.get("recoveries") or 0)
    outside_ms, ratio, notes = judge_outside(inside_ms, walls, recoveries, clocks)
    out = {"outside_ms_per_step": "%.2f" % outside_ms, "outside_ratio": "%.3f" % ratio,
           "outside_walls": "; ".join("%d steps: %s s" % (n, "/".join("%.2f" % w for w in ws))
                                      for n, ws in sorted(walls.items())),
           "runs_own_ms": "; ".join("%d steps: %s" % (n, "/".join("%.2f" % c for c in cs))
                                    for n, cs in sorted(clocks.items()))}
    same = same_runs_ratio(outside_ms, walls, clocks)
    if same is not None:
        out["outside_same_runs_ratio"] = "%.3f" % same
    if notes:
        out["note"] = "; ".join(notes)
    return out


def same_runs_ratio(outside_ms, walls, clocks):
    """The outside figure over the own clock of the long run it came from (the long length's shortest
    wall): the two clocks of the same run, which run-to-run spread does not move; None without it."""
    if not clocks:
        return None
    long_ = max(walls)
    own = clocks[long_][walls[long_].index(min(walls[long_]))]
    return outside_ms / own if own == own and own > 0 else None


def judge_outside(inside_ms, walls, recoveries=0, clocks=None):
    """What the outside clock says of a row: (outside ms/step, outside / inside, notes). `walls` maps
    each of two run lengths (steps) to its runs' wall times (s). The outside figure is the difference
    of the two lengths' shortest wall times over the difference of their steps; its noise, the two
    lengths' spreads (longest minus shortest) over the same. A difference of more than
    OUTSIDE_TOLERANCE is marked CLOCKS DISAGREE, unless it lies within the noise and the noise itself
    is past the tolerance: then the outside clock was too noisy to judge the row. With `clocks` (each
    run's own ms/step, by length, as `walls`) a row's run that the outside figure disagrees with while
    the long run it came from agrees (same_runs_ratio) is a slow or fast run, not a wrong clock: the
    note says so and gives every run's clock. Recoveries in the runs are named whatever the figures:
    the steady clock leaves a recovery out, the wall time does not."""
    short, long_ = sorted(walls)
    span = long_ - short
    outside_ms = 1000.0 * (min(walls[long_]) - min(walls[short])) / span
    noise_ms = 1000.0 * sum(max(w) - min(w) for w in walls.values()) / span
    ratio = outside_ms / inside_ms
    notes = []
    if recoveries:
        notes.append("RECOVERED %d time(s) in these runs: the row's steady clock leaves recoveries out" % recoveries)
    same = same_runs_ratio(outside_ms, walls, clocks)
    if clocks_disagree(ratio):
        if same is not None and not clocks_disagree(same):
            notes.append("this run's clock is off the check's runs (run-to-run spread; each run's own ms/step: %s); "
                         "the long run's own clock agrees with the outside one (%.3fx)"
                         % ("; ".join("%d steps: %s" % (n, "/".join("%.1f" % c for c in cs))
                                      for n, cs in sorted(clocks.items())), same))
        elif noise_ms > OUTSIDE_TOLERANCE * inside_ms and abs(outside_ms - inside_ms) <= noise_ms:
            notes.append("outside clock too noisy to judge: %.1f +- %.1f ms/step (runs of %d and %d steps)"
                         % (outside_ms, noise_ms, short, long_))
        else:
            notes.append("CLOCKS DISAGREE: outside %.1f ms/step (runs of %d and %d steps)" % (outside_ms, short, long_))
    return outside_ms, ratio, notes


# ---------------------------------------------------------------- PyTorch

def torch_probe(args):
    """How many GPUs the python3 of --python sees through torch; None if it cannot import torch."""
    try:
        proc = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return int(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def torch_command(args, workload, schedules, mbs, names=()):
    if schedules == ["best"]:
        cmd = [args.python, os.path.join(HERE, "torch_single.py"), workload, "--steps", str(max(1, args.steps - WARMUP)),
               "--warmup", str(WARMUP), "--variants", ",".join(base_name(n) for n in names)]
        if args.profile_dir:
            cmd += ["--profile-dir", os.path.abspath(args.profile_dir)]
        return cmd + (["--batch", str(asked_batch(args))] if asked_batch(args) else [])
    cmd = [args.python, os.path.join(HERE, "torch_pipelining.py"), workload, "--schedules", ",".join(schedules),
           "--steps", str(max(1, args.steps - WARMUP)), "--warmup", str(WARMUP),
           "--ranks", str(args.ranks), "--timeout", str(max(30, args.timeout - 15))]
    if args.replicas > 1:
        cmd += ["--replicas", str(args.replicas), "--dp", args.dp]
    mbs = sorted(set(m for m in mbs if m))
    if mbs:
        cmd += ["--micro-batches", ",".join(str(m) for m in mbs)]
    if asked_batch(args):
        cmd += ["--batch", str(asked_batch(args))]
    if args.profile_dir:
        cmd += ["--profile-dir", os.path.abspath(args.profile_dir)]
    if args.torch_channels_last:
        cmd += ["--channels-last"]
    return cmd


def run_torch(args, workload, group, schedules, mbs, names=()):
    """One torch_pipelining.py call (the one-process variants, or one pipelined schedule), or
    one torch_single.py call (the best single-GPU variants): its JSON lines, by variant name."""
    cmd = torch_command(args, workload, schedules, mbs, names)
    log = os.path.join(args.out, "%s-torch-%s%s.log" % (workload, group, batch_suffix(args)))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 30, env=env)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        stdout, stderr = e.stdout or "", e.stderr or ""
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        print("  torch %s: past %d s, stopped" % (group, args.timeout + 30), file=sys.stderr)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + stderr + stdout)
    out = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                r = json.loads(line)
                out[r["variant"]] = r
            except (ValueError, KeyError):
                pass
    return out


# ---------------------------------------------------------------- rows, table, CSV, plots

def ratios(rows):
    """Fill each row's vs_* columns from the rows of its workload and batch (merged CSVs of a
    batch sweep: a row at batch 480 is compared with pytorch-1gpu at 480)."""
    by_w = {}
    for r in rows:
        by_w.setdefault((r["workload"], row_batch(r)), []).append(r)
    for w, rs in by_w.items():
        ref = {base_name(r["variant"]): float(r["throughput"]) for r in rs}  # --batch: -bB
        best = max([float(r["throughput"]) for r in rs if r["impl"] == "pytorch"] or [0])
        # torch.distributed.pipelining's fastest row (any schedule, any micro-batch count) on as many GPUs
        pp_best = {}
        for r in rs:
            if r["impl"] == "pytorch" and r["schedule"] in tp.PIPELINED:
                g = str(r.get("gpus") or "")
                pp_best[g] = max(pp_best.get(g, 0), float(r["throughput"]))
        for r in rs:
            t = float(r["throughput"])
            pp = pp_best.get(str(r.get("gpus") or ""))
            r["vs_torch_pp_best"] = "%.3f" % (t / pp) if pp and r["schedule"] not in ("", "single", "best") else ""
            r["vs_pytorch_1gpu"] = "%.3f" % (t / ref["pytorch-1gpu"]) if "pytorch-1gpu" in ref else ""
            r["vs_best_pytorch"] = "%.3f" % (t / best) if best else ""
            r["vs_conveyor_1dev"] = "%.3f" % (t / ref["conveyor-1dev"]) if "conveyor-1dev" in ref else ""
    return rows


def table(rows, workload):
    rs = [r for r in rows if r["workload"] == workload]
    if not rs:
        return ""
    unit = rs[0]["unit"]
    py = [r for r in rs if r["impl"] == "pytorch"]
    best = max(py, key=lambda r: float(r["throughput"]))["variant"] if py else "-"
    x = lambda s: "%.2fx" % float(s) if s not in ("", None) else "-"
    pp = [r for r in py if r["schedule"] in tp.PIPELINED]
    pp_best = max(pp, key=lambda r: float(r["throughput"]))["variant"] if pp else "-"
    lines = ["%s (best PyTorch variant: %s; torch-pp-best: %s)" % (workload.upper(), best, pp_best), "",
             "| variant | GPUs | ms / step | %s / s | vs pytorch-1gpu | vs best PyTorch | vs torch-pp-best | "
             "vs conveyor-1dev | MFU | peak GiB a GPU | outside ms / step |" % unit,
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rs:
        outside = r.get("outside_ms_per_step") or ""
        if outside:  # the row's figure checked from outside (two run lengths)
            outside = "%.1f (%s)" % (float(outside), x(r["outside_ratio"]))
            if r.get("outside_same_runs_ratio"):
                outside = outside[:-1] + "; same run %s)" % x(r["outside_same_runs_ratio"])
            if clocks_disagree(r["outside_ratio"]):
                outside = "**%s**" % outside
        util = "%.1f%%" % (100 * float(r["mfu"])) if r.get("mfu") else "-"
        lines.append("| %s | %s | %.1f | %.0f | %s | %s | %s | %s | %s | %s | %s |" % (
            r["variant"], r.get("gpus") or "-", float(r["ms_per_step"]), float(r["throughput"]),
            x(r["vs_pytorch_1gpu"]), x(r["vs_best_pytorch"]), x(r.get("vs_torch_pp_best")),
            x(r["vs_conveyor_1dev"]), util, peak_column(r.get("peak_gib")), outside or "-"))
    return "\n".join(lines)


def peak_column(peaks):
    """The table's peak memory: the largest GPU's, and every GPU's where they differ (GiB)."""
    vals = [float(v) for v in str(peaks or "").split("/") if v]
    if not vals:
        return "-"
    top = "%.1f" % max(vals)
    return top if len(set("%.1f" % v for v in vals)) == 1 else "%s (%s)" % (top, "/".join("%.1f" % v for v in vals))


def conveyor_peaks(r):
    """A Conveyor run's peak device memory of each stage server (GiB, '/'-joined), from its JSON."""
    peaks = [s.get("memory", {}).get("device_peak_bytes", 0) for s in r.get("stages", [])]
    return "/".join("%.2f" % (b / 2 ** 30) for b in peaks if b)


def write_csv(path, rows):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        out.writeheader()
        out.writerows(rows)
    os.replace(tmp, path)


def read_csv(path):
    with open(path, newline="") as f:
        return [dict(r) for r in csv.DictReader(f)]


def plot(out_dir, workload, rows):
    rows = [r for r in rows if r["workload"] == workload]
    if not rows:
        return []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plots: matplotlib is not installed for %s" % sys.executable, file=sys.stderr)
        return []
    unit = rows[0]["unit"]
    colors = {"pytorch": "#DD8452", "conveyor": "#4C72B0"}
    files = []

    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4.5))
    ax.bar(range(len(rows)), [float(r["throughput"]) for r in rows],
           color=[colors.get(r["impl"], "gray") for r in rows])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["variant"] for r in rows], rotation=50, ha="right", fontsize=8)
    base = [r for r in rows if base_name(r["variant"]) == "pytorch-1gpu"]
    if len(base) == 1:  # one batch
        ax.axhline(float(base[0]["throughput"]), color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel("%s / s" % unit)
    ax.set_title("%s: throughput by variant (orange: PyTorch, blue: Conveyor)" % workload.upper())
    fig.tight_layout()
    path = os.path.join(out_dir, "bench-%s-variants.png" % workload)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    files.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    batches = sorted({row_batch(r) for r in rows})
    for r in rows:
        m, name = int(r["micro_batches"]), base_name(r["variant"])
        if r["impl"] == "pytorch" and r["schedule"] in tp.PIPELINED:
            label = "torch.distributed.pipelining %s" % r["schedule"]
        elif r["impl"] == "pytorch" and r["schedule"] == "tutorial":
            label = "PyTorch tutorial's pipelined class"
        elif r["impl"] == "conveyor" and r["schedule"] not in ("", "naive") and name != "conveyor-1stage-graphs":
            label = "Conveyor %s%s" % (r["schedule"], ", CUDA graphs" if name.endswith("-graphs") else "")
        else:
            continue
        if len(batches) > 1:  # merged CSVs of a batch sweep: a curve per batch
            label += ", batch %d" % row_batch(r)
        series.setdefault((r["impl"], label), []).append((m, float(r["ms_per_step"])))
    ms = set()
    for (impl, label), pts in sorted(series.items()):
        pts.sort()
        ms.update(p[0] for p in pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if impl == "conveyor" else "s",
                linestyle="-" if impl == "conveyor" else "--", label=label)
    for name, style in (("pytorch-1gpu", ":"), ("torch-naive-mp", "-."), ("conveyor-1dev", ":"),
                        ("naive-mp", "-.")):
        for ref in [r for r in rows if base_name(r["variant"]) == name]:  # one per batch
            ax.axhline(float(ref["ms_per_step"]), color=colors[ref["impl"]], linestyle=style, linewidth=1.2,
                       label=ref["variant"])
    if ms:
        ax.set_xscale("log", base=2)
        ticks = sorted(ms)
        ax.set_xticks(ticks)
        # the split size under each count, where the rows share one batch
        ax.set_xticklabels(["%d\n(%s)" % (m, batches[0] // m) if len(batches) == 1 else str(m) for m in ticks])
        ax.minorticks_off()
    ax.set_xlabel("micro-batches per step (split size)")
    ax.set_ylabel("ms / step")
    ax.set_title("%s: the split-size trade-off" % workload.upper())
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "bench-%s-split.png" % workload)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    files.append(path)
    return files


# ---------------------------------------------------------------- commands

def cmd_plot(argv):
    p = argparse.ArgumentParser(prog="bench.py plot", description="merge the CSVs of several runs: "
                                "one table, one CSV per workload and the plots")
    p.add_argument("--csv", nargs="+", required=True)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    merged = {}
    for path in args.csv:
        for r in read_csv(path):
            merged[(r["workload"], r["variant"])] = r
    rows = ratios(list(merged.values()))
    os.makedirs(args.out, exist_ok=True)
    for w in sorted({r["workload"] for r in rows}):
        rs = [r for r in rows if r["workload"] == w]
        # By batch (merged CSVs of a batch sweep); PyTorch's rows first, then Conveyor's; within each,
        # by schedule, then micro-batches
        rank = lambda r: (row_batch(r), r["impl"] != "pytorch", SCHEDULE_ORDER.index(r["schedule"])
                          if r["schedule"] in SCHEDULE_ORDER else len(SCHEDULE_ORDER), r["schedule"],
                          int(r["micro_batches"]))
        rs.sort(key=rank)
        print(table(rs, w) + "\n")
        path = os.path.join(args.out, "bench-%s.csv" % w)
        write_csv(path, rs)
        print("wrote %s" % path)
        for f in plot(args.out, w, rs):
            print("wrote %s" % f)
    return 0


SIZE_COLUMNS = ["pytorch-1gpu", "pytorch-1gpu-cl", "pytorch-1gpu-graph", "pytorch-1gpu-compile", "conveyor-1dev",
                "conveyor-1dev-loop", "conveyor-1dev-graphs", "conveyor-1dev-eager", "conveyor-1dev-unfused",
                "conveyor-1dev-nchw", "conveyor-1stage-graphs"]


def sizes_table(rows):
    """ms per step of every single-device variant by (workload, batch), and the best of each side."""
    lines = ["| workload | batch | " + " | ".join(SIZE_COLUMNS) + " | best PyTorch | best Conveyor | Conveyor / PyTorch |",
             "| --- | ---: | " + " | ".join("---:" for _ in SIZE_COLUMNS) + " | --- | --- | ---: |"]
    groups = {}
    for r in rows:
        m = re.match(r"^(.*)-b(\d+)$", r["variant"])
        if m:
            groups.setdefault((r["workload"], int(m.group(2))), {})[m.group(1)] = r
    for (w, b), by in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        ms = {n: float(r["ms_per_step"]) for n, r in by.items()}
        best = lambda impl: min(((v, n) for n, v in ms.items() if by[n]["impl"] == impl), default=None)
        py, cv = best("pytorch"), best("conveyor")
        lines.append("| %s | %d | %s | %s | %s | %s |" % (
            w.upper(), b, " | ".join("%.1f" % ms[n] if n in ms else "-" for n in SIZE_COLUMNS),
            py[1] if py else "-", cv[1] if cv else "-", "%.2f" % (cv[0] / py[0]) if py and cv else "-"))
    return "\n".join(lines)


def cmd_sizes(argv):
    p = argparse.ArgumentParser(prog="bench.py sizes", description=
                                "the single-device variants (PyTorch's best and Conveyor's) at each workload's full "
                                "batch and a pipeline stage's micro-batches, in one call: one `--batch B` run each, "
                                "then one table of ms per step. Other options go to each run (--bin, --steps, "
                                "--skip, --profile-dir, --timeout, ...)")
    p.add_argument("--w1", default=SIZES["w1"], help="W1's batches (default %s; empty: none)" % SIZES["w1"])
    p.add_argument("--w2", default=SIZES["w2"], help="W2's batches (default %s; empty: none)" % SIZES["w2"])
    p.add_argument("--out", default=".")
    p.add_argument("--full-only", default="", help="comma-separated patterns: variants run only at the full batch "
                   "(the first of --w1/--w2), e.g. '*compile*' (torch.compile's minutes)")
    p.add_argument("--budget", type=float, default=0, help="seconds: a run that would start later is left out")
    p.add_argument("--tabulate", action="store_true",
                   help="run nothing: the table of the CSVs a call (or one stopped midway) left in --out")
    args, rest = p.parse_known_args(argv)
    start = time.time()
    rows, left_out = [], []
    for w in ("w1", "w2"):
        for i, b in enumerate(int(x) for x in getattr(args, w).split(",") if x):
            path = os.path.join(args.out, "bench-%s-b%d.csv" % (w, b))
            if args.tabulate:
                rows += read_csv(path) if os.path.exists(path) else []
                continue
            if args.budget and time.time() - start > args.budget:
                left_out.append("%s at %d" % (w, b))
                continue
            skip = ["--skip", args.full_only] if i > 0 and args.full_only else []
            print("== %s, batch %d" % (w, b), flush=True)
            main([w, "--batch", str(b), "--out", args.out, "--csv", path] + skip + rest)
            if os.path.exists(path):
                rows += read_csv(path)
    text = sizes_table(rows)
    print("\nms per step, by workload and batch\n\n" + text)
    if left_out:
        print("\nleft out (past --budget): %s" % ", ".join(left_out))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sizes.md"), "w") as f:
        f.write(text + "\n")
    return 0 if rows else 1


def main(argv):
    if argv[:1] == ["plot"]:
        return cmd_plot(argv[1:])
    if argv[:1] == ["sizes"]:
        return cmd_sizes(argv[1:])
    if argv[:1] == ["dp"]:  # the seed's comparison: DDP against Conveyor's replicas (bench/dp_gpu.py)
        import dp_gpu
        return dp_gpu.main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=sorted(JOBS), help="or `plot`: see below")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="folder holding `conveyor`")
    p.add_argument("--out", default=".", help="folder for the logs and plots")
    p.add_argument("--csv", default=None, help="CSV to write (default OUT/bench-WORKLOAD.csv; with --batch or "
                   "--global-batch B, OUT/bench-WORKLOAD-bB.csv)")
    p.add_argument("--steps", type=int, default=10, help="steps per run, the first 2 of them warm-up")
    p.add_argument("--outside-steps", type=int, default=None,
                   help="check each Conveyor row from outside: run it again for this many steps and take ms per step "
                        "from the difference of the wall times (default: enough steps for --outside-seconds more; "
                        "0: no check)")
    p.add_argument("--outside-seconds", type=float, default=30,
                   help="how much longer the outside check's long runs last, by the row's own clock (default 30: on "
                        "two H200s W2's start-up varied by 3 s from run to run, W1's by 0.5 s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each row, PyTorch's and Conveyor's alike; the row is the median run's (two-GPU "
                        "runs of one job varied by 7%% in their steady rate on H100s)")
    p.add_argument("--outside-repeats", type=int, default=2,
                   help="runs of each length for the outside check, alternated; the shortest of each counts")
    p.add_argument("--micro-batches", default=None, help="default 2,4,6,12 for w1, 4,8,16 for w2")
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved,zero-bubble", help="Conveyor's schedules")
    p.add_argument("--torch-schedules", default="tutorial,gpipe,1f1b,interleaved",
                   help="PyTorch's micro-batched variants: tutorial, gpipe, 1f1b, interleaved, interleaved-zb, "
                        "zbv, dualpipev")
    p.add_argument("--only", default=None, help="comma-separated patterns: run only variants matching one")
    p.add_argument("--skip", default=None, help="comma-separated patterns: leave out variants matching one")
    p.add_argument("--device", default="cuda:0", help="device of conveyor-1dev")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="add a top-level key to every Conveyor job (e.g. nccl_ctas=4); repeatable")
    p.add_argument("--trace-dir", help="write each pipelined Conveyor run's last-step timeline (JSON, PNG) here")
    p.add_argument("--profile-dir", help="write operator profiles (Chrome traces) of one step of each run here: "
                   "Conveyor's of its last warm-up step (profile_step), PyTorch's of one step after the timed ones; "
                   "bench/profile_summary.py tabulates them")
    p.add_argument("--python", default=shutil.which("python3") or sys.executable,
                   help="the python3 that runs torch_pipelining.py")
    p.add_argument("--ranks", type=int, default=2,
                   help="stages (one per GPU) of the pipelined variants, PyTorch's and Conveyor's")
    p.add_argument("--replicas", type=int, default=1,
                   help="copies of every pipelined variant, each on --ranks GPUs of its own and its share of the "
                        "batch (micro-batches per copy): Conveyor's replicas: R; PyTorch's with DDP around each "
                        "stage (--dp); names end in -rR")
    p.add_argument("--dp", choices=("ddp", "allreduce"), default="ddp",
                   help="with --replicas, PyTorch's copies: DistributedDataParallel around each stage module, or "
                        "each gradient all-reduced after the schedule's step")
    p.add_argument("--no-pytorch", action="store_true", help="leave out every PyTorch variant")
    p.add_argument("--graphs", action="store_true",
                   help="add each stage-server variant again with cuda_graphs: true (<variant>-graphs), "
                        "and conveyor-1stage-graphs")
    p.add_argument("--torch-channels-last", action="store_true",
                   help="PyTorch's variants in channels-last memory with cudnn.benchmark (W1: its fastest "
                        "convolutions); Conveyor's stay as they are")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, default=0,
                       help="measure the single-device variants at this batch (a stage's micro-batch: W1 60, W2 8 "
                            "or 4); the variants' names end in -bB")
    batch.add_argument("--global-batch", type=int, default=0, metavar="B",
                       help="measure every variant, the pipelined ones included, at global batch B (a batch "
                            "sweep); the variants' names end in -bB")
    p.add_argument("--timeout", type=int, default=300, help="seconds for one Conveyor run or one torch call")
    p.add_argument("--dry-run", action="store_true", help="print the variants and commands, run nothing")
    args = p.parse_args(argv)
    args.schedules = [s for s in args.schedules.split(",") if s]
    w = args.workload
    if asked_batch(args) < 0:
        p.error("--batch, --global-batch: a positive count of samples")
    if asked_batch(args):
        args.set = args.set + ["batch_size=%d" % asked_batch(args)]
        if asked_batch(args) > train_samples(w):  # Conveyor refuses a batch larger than its training split
            args.set.append("data.train_samples=%d" % asked_batch(args))
    args.torch_schedules = [s for s in args.torch_schedules.split(",") if s]
    for s in args.torch_schedules:
        if s not in ("tutorial",) + tp.PIPELINED:
            p.error("--torch-schedules: unknown %r" % s)
    args.micro_batches = args.micro_batches or DEFAULT_MICRO_BATCHES[w]
    # A batch sweep's runs into one --out keep a CSV each, for `bench.py plot --csv OUT/bench-w1*.csv`.
    csv_path = args.csv or os.path.join(args.out, "bench-%s%s.csv" % (w, batch_suffix(args)))
    variants = plan(args)
    uneven = sorted({v["m"] for v in variants if asked_batch(args) % v["m"]})
    if uneven:  # PyTorch's pipelines want equal micro-batches, and so does a fair comparison
        p.error("batch %d does not split into %s equal micro-batches: give --micro-batches that divide it"
                % (asked_batch(args), " or ".join(str(m) for m in uneven)))
    unit, per_sample = UNITS[w]

    # One torch_pipelining.py call for the one-process variants, one per pipelined schedule
    # (so that a schedule that fails or hangs costs only its own rows).
    torch_groups = {}
    for v in variants:
        if v["impl"] == "pytorch":
            group = v["schedule"] if v["schedule"] in tp.PIPELINED + ("best",) else "local"
            g = torch_groups.setdefault(group, {"schedules": [], "mbs": [], "names": []})
            g["names"].append(v["variant"])
            if v["schedule"] not in g["schedules"]:
                g["schedules"].append(v["schedule"])
            if v["schedule"] not in ("single", "naive"):
                g["mbs"].append(v["m"])
    if args.dry_run:
        print("%s: %d variants, CSV %s" % (w, len(variants), csv_path))
        for group, g in torch_groups.items():
            print("  " + " ".join(torch_command(args, w, g["schedules"], g["mbs"], g["names"])))
        for v in variants:
            if v["impl"] == "conveyor":
                print("  %-22s %s  (job %s, schedule %s, micro_batches %d%s)" % (
                    v["variant"], " ".join(conveyor_command(args, v, "JOB")[:2]), JOBS[w],
                    v["schedule"] or "-", v["m"], ", batch_size %d" % asked_batch(args) if asked_batch(args) else ""))
            else:
                print("  %-22s torch_pipelining.py --schedules %s%s" % (
                    v["variant"], v["schedule"], " --batch %d" % asked_batch(args) if asked_batch(args) else ""))
        return 0
    if not variants:
        print("no variant left to run (see --only, --skip)", file=sys.stderr)
        return 2

    os.makedirs(args.out, exist_ok=True)
    rows = []
    failed = []

    def add(v, sps, statistic, note="", **extra):
        stages = extra.pop("stages", "")
        gpus = extra.pop("gpus", "")
        ms = 1000.0 * batch_size(w, args) / sps
        util = mfu(w, batch_size(w, args), ms, int(gpus) if gpus else 0)
        extra["mfu"] = "%.4f" % util if util is not None else ""
        rows.append(dict({"gpus": gpus, "workload": w, "variant": v["variant"], "impl": v["impl"], "schedule": v["schedule"],
                          "micro_batches": v["m"], "stages": stages,
                          "ms_per_step": "%.2f" % (1000.0 * batch_size(w, args) / sps),
                          "samples_per_second": "%.3f" % sps, "throughput": "%.1f" % (sps * per_sample),
                          "unit": unit, "statistic": statistic, "note": note}, **extra))
        ratios(rows)
        write_csv(csv_path, rows)
        print("  %-26s %10.1f %s/s  %8.1f ms/step %s" % (v["variant"], sps * per_sample, unit, ms, note), flush=True)

    if torch_groups:
        gpus = torch_probe(args)
        if gpus is None:
            print("  PyTorch variants skipped: %s cannot import torch" % args.python, file=sys.stderr)
            failed += [v["variant"] for v in variants if v["impl"] == "pytorch"]
            torch_groups = {}
        else:
            print("  %s: torch sees %d GPU(s)" % (args.python, gpus), flush=True)
    for group, g in torch_groups.items():
        calls = [run_torch(args, w, group, g["schedules"], g["mbs"], g["names"]) for _ in range(args.repeats)]
        for v in variants:
            if v["impl"] != "pytorch" or v["schedule"] not in g["schedules"]:
                continue
            results = [c.get(v["variant"]) for c in calls]
            ok = [x for x in results if x and "error" not in x and x.get("samples_per_second")]
            # A row whose runs did not all succeed is not measured: the first failure says why.
            failures = [x for x in results if x not in ok]
            r = median_run(ok, lambda x: x["samples_per_second"]) if not failures else failures[0]
            if not r or "error" in r or not r.get("samples_per_second"):
                print("  %s: %s" % (v["variant"], (r or {}).get("error", "no result, see the log")),
                      file=sys.stderr)
                failed.append(v["variant"])
                continue
            add(v, r["samples_per_second"], repeated(args, r.get("statistic") or tp.statistic(r["iters"], r["warmup"])),
                note="channels-last, cudnn.benchmark" if args.torch_channels_last and v["schedule"] != "best" else "",
                stages=r.get("stages", ""), gpus=r.get("gpus", ""), final_loss=r.get("loss", ""),
                peak_gib="/".join(str(g) for g in r["peak_gib"]) if isinstance(r.get("peak_gib"), list)
                else r.get("peak_gib", ""))

    for v in variants:
        if v["impl"] != "conveyor":
            continue
        runs, note = [], ""
        for _ in range(args.repeats):
            r, note = run_conveyor(args, w, v)
            if not r:
                break
            runs.append(r)
        if len(runs) < args.repeats:
            failed.append(v["variant"])
            continue
        r = median_run(runs, lambda x: x["steady_samples_per_second"])
        outside = outside_check(args, w, v, runs, own_ms(w, args, r))
        note = "; ".join(x for x in (note, outside.pop("note", "")) if x)
        st = r.get("stages", [])
        add(v, r["steady_samples_per_second"],
            repeated(args, tp.statistic(r.get("steady_steps", args.steps - WARMUP), WARMUP)), note,
            **outside,
            stages=len(st) or 1, gpus=args.ranks * args.replicas if pipelined(v) else 1,
            peak_gib=conveyor_peaks(r), final_loss=r.get("final_loss", ""), median_step_ms=median_step_ms(r),
            busy_fraction="/".join("%.3f" % s.get("busy_fraction", 0) for s in st),
            theoretical_idle_fraction="%.3f" % r["theoretical_idle_fraction"] if st else "")

    print()
    print(table(rows, w))
    if failed:
        print("\nnot measured: %s" % ", ".join(failed))
    print("\nwrote %s" % csv_path)
    for f in plot(args.out, w, rows):
        print("wrote %s" % f)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
