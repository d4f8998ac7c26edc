#!/usr/bin/env python3
"""bench.py and torch_pipelining.py against PyTorch's zero-bubble schedules (issue 54): where the
V schedules place their stages, which configurations run, W2's model FLOPs, and the columns that
compare every row with torch-pp-best, with its MFU and its peak memory (ctest bench.schedules).
Needs no torch."""
import argparse
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench_report  # noqa: E402
import bench_workloads  # noqa: E402
import torch_pipelining as tp  # noqa: E402


def tp_opts(schedules, micro_batches, ranks=2):
    return argparse.Namespace(workload="w2", schedules=schedules, micro_batches=micro_batches, ranks=ranks,
                              chunks=2, replicas=1, batch=0)


def row(variant, impl, schedule, ms, gpus, peaks=""):
    return {"workload": "w2", "variant": variant, "impl": impl, "schedule": schedule, "micro_batches": 4,
            "ms_per_step": "%.2f" % ms, "throughput": "%.1f" % (32 * 1024 * 1000.0 / ms), "gpus": gpus,
            "unit": "tokens", "peak_gib": peaks, "mfu": ""}


class Placement(unittest.TestCase):
    def test_v_schedules_fold_the_stages_back_onto_the_first_rank(self):
        for s in tp.V_SHAPED:
            self.assertEqual([tp.stage_rank(s, i, 2) for i in range(4)], [0, 1, 1, 0])
            self.assertEqual([tp.stage_rank(s, i, 4) for i in range(8)], [0, 1, 2, 3, 3, 2, 1, 0])

    def test_the_others_go_round_robin(self):
        self.assertEqual([tp.stage_rank("interleaved-zb", i, 2) for i in range(4)], [0, 1, 0, 1])
        self.assertEqual([tp.stage_rank("1f1b", i, 4) for i in range(4)], [0, 1, 2, 3])

    def test_stages_per_configuration(self):
        configs = {(s, m): (stages, err) for s, m, stages, err in
                   tp.configurations(tp_opts(["1f1b", "interleaved-zb", "zbv", "dualpipev"], [4], ranks=2))}
        self.assertEqual(configs[("1f1b", 4)], (2, None))
        self.assertEqual(configs[("zbv", 4)], (4, None))
        self.assertEqual(configs[("dualpipev", 4)], (4, None))
        self.assertEqual(configs[("interleaved-zb", 4)], (4, None))
        (_, _, stages, err), = tp.configurations(tp_opts(["interleaved-zb"], [2], ranks=4))
        self.assertEqual(stages, 8)
        self.assertIn("multiple of the ranks", err or "")

    def test_names(self):
        self.assertEqual(tp.variant_name("dualpipev", 8), "torch-pp-dualpipev-m8")
        self.assertIn("zbv", tp.PIPELINED)


class Columns(unittest.TestCase):
    def test_w2_model_flops(self):
        # 32 x 1024 tokens x (6 x 1.2735e9 + 12 x 24 x 1024 x 2048)
        self.assertAlmostEqual(bench_workloads.w2_model_flops(32) / 1e12, 270.17, places=1)
        self.assertAlmostEqual(bench_workloads.mfu("w2", 32, 500.0, 1), 270.17e12 / (0.5 * 989.4e12), places=4)
        self.assertIsNone(bench_workloads.mfu("w1", 120, 20.0, 1))

    def test_torch_pp_best_is_the_fastest_pipelining_row_on_as_many_gpus(self):
        rows = bench_report.ratios([row("pytorch-1gpu", "pytorch", "single", 500, 1),
                             row("torch-pp-1f1b-m8", "pytorch", "1f1b", 313, 2),
                             row("torch-pp-zbv-m4", "pytorch", "zbv", 286, 2),
                             row("torch-pp-dualpipev-m8", "pytorch", "dualpipev", 194, 4),
                             row("zero-bubble-m4", "conveyor", "zero-bubble", 269.3, 2),
                             row("zero-bubble-m4-r2", "conveyor", "zero-bubble", 145.4, 4),
                             row("conveyor-1dev", "conveyor", "", 480, 1)])
        by = {r["variant"]: r for r in rows}
        self.assertEqual(by["zero-bubble-m4"]["vs_torch_pp_best"], "%.3f" % (286 / 269.3))
        self.assertEqual(by["zero-bubble-m4-r2"]["vs_torch_pp_best"], "%.3f" % (194 / 145.4))
        self.assertEqual(by["torch-pp-1f1b-m8"]["vs_torch_pp_best"], "%.3f" % (286 / 313))
        self.assertEqual(by["pytorch-1gpu"]["vs_torch_pp_best"], "")
        self.assertEqual(by["conveyor-1dev"]["vs_torch_pp_best"], "")
        self.assertIn("vs torch-pp-best", bench_report.table(rows, "w2"))

    def test_peak_column(self):
        self.assertEqual(bench_report.peak_column("18.9/12.8"), "18.9 (18.9/12.8)")
        self.assertEqual(bench_report.peak_column("12.01/12.04"), "12.0")
        self.assertEqual(bench_report.peak_column(""), "-")
        self.assertEqual(bench_report.conveyor_peaks({"stages": [{"memory": {"device_peak_bytes": 2 ** 31}},
                                                          {"memory": {"device_peak_bytes": 0}}]}), "2.00")


if __name__ == "__main__":
    unittest.main()
