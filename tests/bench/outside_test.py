#!/usr/bin/env python3
"""bench.py's outside clock (issue 31): how a row's two clocks are judged
(ctest bench.outside_judgement). The figures are those of one call on 2x H100, 2026-11-26 (W1;
bench/results/issue31-2026-11-26b/)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import argparse  # noqa: E402
import bench_outside  # noqa: E402
import bench_runners  # noqa: E402
import torchscript_w2  # noqa: E402


class OutsideJudgement(unittest.TestCase):
    def test_agreeing_clocks_carry_no_note(self):
        ms, ratio, notes = bench_outside.judge_outside(18.79, {20: [7.00, 6.88], 819: [21.45, 21.25]})
        self.assertAlmostEqual(ms, 17.98, places=2)
        self.assertAlmostEqual(ratio, 0.957, places=3)
        self.assertEqual(notes, [])

    def test_recoveries_are_named_even_where_the_clocks_agree(self):
        _, _, notes = bench_outside.judge_outside(18.79, {20: [7.00, 6.88], 819: [21.45, 21.25]}, recoveries=1)
        self.assertEqual(len(notes), 1)
        self.assertIn("RECOVERED 1 time(s)", notes[0])

    def test_a_row_whose_runs_recovered_disagrees_and_says_why(self):
        ms, ratio, notes = bench_outside.judge_outside(26.69, {20: [14.95, 21.78], 583: [57.77, 48.62]}, recoveries=5)
        self.assertAlmostEqual(ms, 59.80, places=2)
        self.assertGreater(ratio, 2)
        self.assertTrue(any(n.startswith("RECOVERED 5") for n in notes))
        self.assertTrue(any(n.startswith("CLOCKS DISAGREE") for n in notes))

    def test_a_difference_within_the_noise_is_not_called_a_disagreement(self):
        # Same-length runs 2 s apart over 300 extra steps: +-6.7 ms/step of noise on a 20 ms row.
        _, ratio, notes = bench_outside.judge_outside(20.0, {20: [10.0, 12.0], 320: [16.6, 16.7]})
        self.assertTrue(bench_outside.clocks_disagree(ratio))
        self.assertEqual(len(notes), 1)
        self.assertIn("too noisy to judge", notes[0])

    def test_a_difference_past_the_noise_is_a_disagreement(self):
        _, _, notes = bench_outside.judge_outside(18.47, {20: [10.49, 11.71], 833: [26.84, 26.88]})
        self.assertEqual(len(notes), 1)
        self.assertIn("CLOCKS DISAGREE: outside 20.1 ms/step", notes[0])

    def test_a_slow_run_whose_check_runs_agree_is_spread_not_a_wrong_clock(self):
        # W1 over two H100s (2026-11-26): the row's 100-step run at 21.18 ms, the check's own runs at 19.6 to 19.8.
        walls = {100: [20.24, 15.96], 1753: [49.14, 48.19]}
        clocks = {100: [21.18, 19.78], 1753: [19.70, 19.64]}
        ms, ratio, notes = bench_outside.judge_outside(21.18, walls, clocks=clocks)
        self.assertAlmostEqual(ms, 19.50, places=1)
        self.assertTrue(bench_outside.clocks_disagree(ratio))
        self.assertAlmostEqual(bench_outside.same_runs_ratio(ms, walls, clocks), ms / 19.64)
        self.assertEqual(len(notes), 1)
        self.assertIn("the long run's own clock agrees with the outside one (0.993x)", notes[0])
        self.assertIn("100 steps: 21.2/19.8", notes[0])

    def test_a_long_run_whose_own_clock_disagrees_is_still_a_disagreement(self):
        walls = {20: [10.49, 11.71], 833: [26.84, 26.88]}
        _, _, notes = bench_outside.judge_outside(18.47, walls, clocks={20: [18.47, 18.5], 833: [18.4, 18.45]})
        self.assertEqual(len(notes), 1)
        self.assertIn("CLOCKS DISAGREE: outside 20.1 ms/step", notes[0])


class RepeatedRows(unittest.TestCase):
    """--repeats: a row is its median run, and the outside check counts the row's runs as its short ones."""

    def setUp(self):
        self.lengths = []
        self.saved = bench_runners.run_conveyor

        def fake(args, workload, v, steps=None):  # 10 ms a step and 2 s of start-up, by every clock
            n = steps or args.steps
            self.lengths.append(n)
            return {"wall_s": 2.0 + 0.01 * n, "steady_samples_per_second": 120 / 0.01, "recoveries": 0}, ""
        bench_runners.run_conveyor = fake

    def tearDown(self):
        bench_runners.run_conveyor = self.saved

    def args(self, repeats):
        import argparse
        return argparse.Namespace(steps=20, outside_steps=220, outside_seconds=30, outside_repeats=2,
                                  repeats=repeats, batch=None, global_batch=120)

    def test_the_median_run_is_the_row(self):
        runs = [{"steady_samples_per_second": s} for s in (5.0, 9.0, 7.0)]
        self.assertEqual(bench_outside.median_run(runs, lambda r: r["steady_samples_per_second"])["steady_samples_per_second"], 7.0)
        self.assertEqual(bench_outside.median_run(runs[:2], lambda r: r["steady_samples_per_second"])["steady_samples_per_second"], 5.0)

    def test_one_run_a_row_alternates_long_short_long(self):
        args = self.args(1)
        first = {"wall_s": 2.2, "steady_samples_per_second": 12000.0}
        out = bench_runners.outside_check(args, "w1", {}, [first], 10.0)
        self.assertEqual(self.lengths, [220, 20, 220])
        self.assertAlmostEqual(float(out["outside_ms_per_step"]), 10.0, places=2)
        self.assertEqual(out["runs_own_ms"], "20 steps: 10.00/10.00; 220 steps: 10.00/10.00")

    def test_a_rows_repeats_are_the_short_runs(self):
        args = self.args(3)
        firsts = [{"wall_s": 2.2, "steady_samples_per_second": 12000.0}] * 3
        bench_runners.outside_check(args, "w1", {}, firsts, 10.0)
        self.assertEqual(self.lengths, [220, 220])


class TorchscriptW2OutsideClock(unittest.TestCase):
    """torchscript_w2.py --outside-steps (issue 35's W2 rows): the variant's job run again N steps
    longer (steps set on the command line), the shortest walls' difference over N beside the row's
    figure, judged as bench.py judges."""

    def check(self, runs, repeats=2, row=None, only=None):
        asked = []

        def run(args, name, job_path, steps=None):
            asked.append((name, job_path, steps))
            return dict(runs.pop(0), variant=name)
        saved = torchscript_w2.run_conveyor
        torchscript_w2.run_conveyor = run
        try:
            row = row or {"variant": "exported-gpt", "ms_per_step": 497.0, "wall_s": 30.0}
            args = argparse.Namespace(steps=6, outside_steps=40, outside_repeats=repeats, outside_variants=only)
            return torchscript_w2.check_outside(args, row, "j.yaml"), asked
        finally:
            torchscript_w2.run_conveyor = saved

    def test_the_longer_runs_alternate_with_the_rows_and_the_figure_is_the_shortest_walls_difference(self):
        row, asked = self.check([{"ms_per_step": 496.0, "wall_s": 50.5}, {"ms_per_step": 497.5, "wall_s": 29.7},
                                 {"ms_per_step": 496.5, "wall_s": 49.6}])
        self.assertEqual(asked, [("exported-gpt", "j.yaml", 46), ("exported-gpt", "j.yaml", 6),
                                 ("exported-gpt", "j.yaml", 46)])
        self.assertEqual(row["outside_ms_per_step"], 497.5)  # (49.6 - 29.7) / 40
        self.assertEqual(row["outside_note"], "")
        self.assertEqual(row["outside_walls"], "6 steps: 30.0/29.7 s; 46 steps: 50.5/49.6 s")

    def test_walls_that_contradict_the_row_mark_it(self):
        row, _ = self.check([{"ms_per_step": 497.0, "wall_s": 53.0}], repeats=1)  # 575 ms a step outside
        self.assertIn("CLOCKS DISAGREE", row["outside_note"])

    def test_a_failed_run_is_said_and_a_failed_row_not_checked(self):
        row, _ = self.check([{"ms_per_step": 496.0, "wall_s": 50.5}, {"error": "exit 1, see x.log"}])
        self.assertEqual(row["ms_per_step"], 497.0)
        self.assertIn("run of 6 steps failed: exit 1", row["outside_note"])
        row, asked = self.check([], row={"variant": "zoo-gpt", "error": "exit 1"})
        self.assertEqual((asked, row), ([], {"variant": "zoo-gpt", "error": "exit 1"}))

    def test_outside_variants_leaves_the_other_rows_unchecked(self):
        row, asked = self.check([], only="exported-gpt-2stage,zoo-gpt-2stage")
        self.assertEqual((asked, "outside_note" in row), ([], False))


if __name__ == "__main__":
    unittest.main()
