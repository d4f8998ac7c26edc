#!/usr/bin/env python3
"""bench.py --replicas (issue 36 item 4: W2 as 2 replicas x 2 stages against
torch.distributed.pipelining with DDP): which rows are copied, what each side is
asked to run, and the process groups of PyTorch's side (ctest bench.replicas).
The groups are checked through Gloo where python3 imports torch, else skipped."""
import argparse
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench_runners  # noqa: E402
import bench_workloads  # noqa: E402
import dp_gpu  # noqa: E402
import torch_pipelining as tp  # noqa: E402


def bench_args(*extra):
    """bench.py's parsed arguments as main() leaves them, for w2."""
    args = argparse.Namespace(workload="w2", micro_batches="4,8", schedules=["1f1b"], torch_schedules=["1f1b"],
                              graphs=False, batch=0, global_batch=0, only=None, skip=None, no_pytorch=False,
                              replicas=1, dp="ddp", ranks=2, timeout=130, steps=6, profile_dir=None,
                              torch_channels_last=False, python="python3", bin="bin", trace_dir=None)
    for kv in extra:
        setattr(args, *kv)
    return args


class ReplicaRows(unittest.TestCase):
    def test_only_the_pipelines_are_copied_and_named_so(self):
        names = {v["variant"] for v in bench_workloads.plan(bench_args(("replicas", 2)))}
        self.assertIn("pytorch-1gpu", names)
        self.assertIn("conveyor-1dev", names)
        self.assertIn("torch-pp-1f1b-m4-r2", names)
        self.assertIn("1f1b-m8-r2", names)
        self.assertIn("naive-mp-r2", names)
        self.assertNotIn("1f1b-m4", names)
        self.assertIn("1f1b-m4", {v["variant"] for v in bench_workloads.plan(bench_args())})

    def test_pytorch_is_asked_for_the_copies_and_names_its_rows_as_bench_does(self):
        args = bench_args(("replicas", 2), ("dp", "allreduce"))
        cmd = bench_runners.torch_command(args, "w2", ["1f1b"], [4])
        self.assertEqual(cmd[cmd.index("--replicas") + 1], "2")
        self.assertEqual(cmd[cmd.index("--dp") + 1], "allreduce")
        opts = argparse.Namespace(replicas=2, batch=0)
        self.assertEqual(tp.run_name(opts, "1f1b", 4), "torch-pp-1f1b-m4-r2")
        self.assertEqual(tp.run_name(opts, "single", 1), "pytorch-1gpu")

    def test_a_replica_share_that_the_micro_batches_do_not_divide_is_refused(self):
        opts = argparse.Namespace(workload="w2", batch=0, schedules=["single", "1f1b"], micro_batches=[4, 32],
                                  ranks=2, chunks=2, replicas=2)
        errors = {(s, m): err for s, m, _, err in tp.configurations(opts)}
        self.assertIsNone(errors[("single", 1)])
        self.assertIsNone(errors[("1f1b", 4)])
        self.assertIn("a replica's batch 16", errors[("1f1b", 32)])


class DpOutsideClock(unittest.TestCase):
    """dp_gpu.py --outside-steps: a Conveyor row run again N steps longer, its wall times' difference
    over N beside the row's own figure (bench.py's judgement), and a failed longer run said."""

    def row(self, walls, ms=19.0):
        def once(args, replicas, collectives, graphs, steps):
            wall = walls.get(steps)
            return None if wall is None else (ms, ms - 0.1, wall)
        saved = dp_gpu.run_conveyor_once
        dp_gpu.run_conveyor_once = once
        try:
            return dp_gpu.run_conveyor(argparse.Namespace(steps=100, outside_steps=200, outside_repeats=1), 2)
        finally:
            dp_gpu.run_conveyor_once = saved

    def test_the_outside_figure_is_the_walls_difference_over_the_extra_steps(self):
        ms, median, outside = self.row({100: 10.0, 300: 13.8})
        self.assertEqual((ms, median), (19.0, 18.9))
        self.assertEqual(outside["outside_ms_per_step"], 19.0)
        self.assertEqual(outside["outside_ratio"], 1.0)
        self.assertEqual(outside["outside_note"], "")

    def test_a_row_whose_clock_the_walls_contradict_is_marked(self):
        _, _, outside = self.row({100: 10.0, 300: 14.4})  # 22 ms a step outside against 19
        self.assertEqual(outside["outside_ms_per_step"], 22.0)
        self.assertIn("CLOCKS DISAGREE", outside["outside_note"])

    def test_a_failed_longer_run_is_said_and_the_row_kept(self):
        ms, _, outside = self.row({100: 10.0})
        self.assertEqual(ms, 19.0)
        self.assertEqual(outside, {"outside_note": "the outside clock's run of 300 steps failed"})

    def test_repeats_alternate_the_lengths_and_the_shortest_walls_count(self):
        asked, walls = [], {100: [10.9], 300: [14.1, 13.9]}

        def once(args, replicas, collectives, graphs, steps):
            asked.append(steps)
            return 19.0, 18.9, walls[steps].pop(0)
        saved = dp_gpu.run_conveyor_once
        dp_gpu.run_conveyor_once = once
        try:
            # the row's own run (10.0 s), then 300, 100, 300
            walls[100].insert(0, 10.0)
            _, _, outside = dp_gpu.run_conveyor(argparse.Namespace(steps=100, outside_steps=200, outside_repeats=2), 2)
        finally:
            dp_gpu.run_conveyor_once = saved
        self.assertEqual(asked, [100, 300, 100, 300])
        self.assertEqual(outside["outside_ms_per_step"], 19.5)  # (13.9 - 10.0) / 200
        self.assertEqual(outside["outside_walls"], "100 steps: 10.00/10.90 s; 300 steps: 14.10/13.90 s")

    def test_each_row_is_in_the_csv_before_the_next_variant_runs(self):
        # A batch cut by its timeout (bench/gpu/replicas.sh) keeps the rows it finished.
        import csv
        import tempfile
        seen = []

        def ddp(replicas, batch, steps):
            return 35.0

        def conveyor(args, replicas, collectives="auto", graphs=True):
            with open(os.path.join(args.out, "dp-gpu.csv")) as f:
                seen.extend(row["variant"] for row in csv.DictReader(f))
            raise RuntimeError("killed")
        saved = dp_gpu.run_ddp, dp_gpu.run_conveyor
        dp_gpu.run_ddp, dp_gpu.run_conveyor = ddp, conveyor
        try:
            with tempfile.TemporaryDirectory() as out:
                dp_gpu.main(["--out", out, "--variants", "pytorch-ddp,conveyor-rx1"])
        finally:
            dp_gpu.run_ddp, dp_gpu.run_conveyor = saved
        self.assertEqual(seen, ["pytorch-ddp-2"])

    def test_the_captured_ddp_row_asks_ddp_for_a_graph(self):
        import csv
        import tempfile
        asked = []

        def ddp(replicas, batch, steps, graph=False):
            asked.append((replicas, batch, graph))
            return 20.0 if graph else 30.0
        saved = dp_gpu.run_ddp
        dp_gpu.run_ddp = ddp
        try:
            with tempfile.TemporaryDirectory() as out:
                dp_gpu.main(["--out", out, "--batch", "480", "--variants", "pytorch-ddp,pytorch-ddp-graph"])
                with open(os.path.join(out, "dp-gpu.csv")) as f:
                    rows = {row["variant"]: row["ms_per_step"] for row in csv.DictReader(f)}
        finally:
            dp_gpu.run_ddp = saved
        self.assertEqual(asked, [(2, 480, False), (2, 480, True)])
        self.assertEqual(rows, {"pytorch-ddp-2": "30.0", "pytorch-ddp-2-graph": "20.0"})


def group_worker(rank, port, queue):
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    pp, dp = tp.replica_groups(dist, 2, 2)
    copy, stage = rank // 2, rank % 2
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.full((2,), float(rank))
    tp.average_gradients(dist, [p], dp[stage], 2)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=pp[copy])
    queue.put((rank, p.grad.tolist(), t.item()))
    dist.destroy_process_group()


class ReplicaGroups(unittest.TestCase):
    def test_each_stage_averages_over_its_copies_and_each_pipeline_holds_its_own_ranks(self):
        try:
            import torch.multiprocessing as mp
        except ImportError:
            self.skipTest("python3 cannot import torch")
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(group_worker, args=(tp.free_port(), queue), nprocs=4, start_method="spawn")
        got = dict((r, (g, t)) for r, g, t in (queue.get() for _ in range(4)))
        # Stage 0 of both copies is ranks 0 and 2 (mean 1), stage 1 ranks 1 and 3 (mean 2);
        # copy 0 is ranks 0 and 1 (sum 1), copy 1 ranks 2 and 3 (sum 5).
        self.assertEqual(got, {0: ([1.0, 1.0], 1.0), 1: ([2.0, 2.0], 1.0), 2: ([1.0, 1.0], 5.0),
                               3: ([2.0, 2.0], 5.0)})


if __name__ == "__main__":
    unittest.main()
