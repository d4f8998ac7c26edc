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
                            through unbind's stack and a copy, without the fused split)
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
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_pipelining as tp  # noqa: E402  (imports no torch at module level)
from bench_workloads import (DEFAULT_MICRO_BATCHES, JOBS, ROOT, SCHEDULE_ORDER, SIZES, UNITS, WARMUP,
    asked_batch, batch_size, batch_suffix, mfu, pipelined, plan, row_batch, train_samples)  # noqa: E402
from bench_outside import median_run  # noqa: E402
from bench_runners import (conveyor_command, median_step_ms, outside_check, own_ms, repeated, run_conveyor,
    run_torch, torch_command, torch_probe)  # noqa: E402
from bench_report import conveyor_peaks, plot, ratios, read_csv, sizes_table, table, write_csv  # noqa: E402


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
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved,zero-bubble,zbv", help="Conveyor's schedules")
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
