#!/usr/bin/env python3
"""Tests of the studies' shared parts: tools/job_runs.py (reading the workers' JSON-lines logs,
a run's measured values), studies/crossover_study.py's time-to-target runs (stopping at the
target or the limit) and report, and studies/advise_validation.py."""

import json
import math
import os
import shutil
import signal
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)

import advise_validation  # noqa: E402
import crossover_study  # noqa: E402
import data_path_targets as targets  # noqa: E402
import job_runs  # noqa: E402
import local_sgd_study  # noqa: E402
import scaling_bench  # noqa: E402


# A job that would go on training after its evaluations: only SIGTERM ends it. Worker 0's and
# worker 1's evaluations go to their JSON logs (argv[2], argv[3]), as ps_worker writes them.
# SIGTERM is blocked and taken with sigwait, never handled by printing from a handler (a handler
# runs between any two bytecodes, also inside a print, and printing there fails with
# "reentrant call").
FAKE_RUN = r"""
import json, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
logs = [open(sys.argv[2], "a"), open(sys.argv[3], "a")]
for epoch, metric in enumerate([float(v) for v in sys.argv[1].split(",")], 1):
    for worker, value in ((1, 0.9999), (0, metric)):
        logs[worker].write(json.dumps(dict(type="eval", worker=worker, epoch=epoch, step=10 * epoch,
                                           time_s=epoch * 1.5, accuracy=value)) + "\n")
        logs[worker].flush()
print("evaluated", flush=True)
signum = signal.sigwait({signal.SIGTERM})
print("stopped by signal %d" % signum, flush=True)
"""


class TimeToTargetTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.log0, self.log1 = (os.path.join(self.dir, "worker-%d.jsonl" % j) for j in range(2))

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_fake(self, metrics, limit):
        return job_runs.run_until([sys.executable, "-c", FAKE_RUN, metrics, self.log0, self.log1], 0.85, limit,
                                  self.log0)

    def test_eval_records_of_both_kinds_of_model(self):
        self.assertEqual(job_runs.eval_record(dict(type="eval", worker=0, epoch=3, time_s=7.5, accuracy=0.8512)),
                         (3, 0.8512, 7.5))
        self.assertEqual(job_runs.eval_record(dict(type="eval", worker=0, epoch=2, time_s=4.1, auc=0.8237)),
                         (2, 0.8237, 4.1))
        self.assertIsNone(job_runs.eval_record(dict(type="done", worker=0)))

    def test_stops_the_run_at_the_first_evaluation_reaching_the_target(self):
        evals, reached, out, _, failed = self.run_fake("0.80,0.84,0.86,0.90", 3600)  # no limit in a test's time
        self.assertEqual(reached, (3, 0.86, 4.5))
        self.assertFalse(failed)
        self.assertEqual([e[0] for e in evals], [1, 2, 3])  # none counted after the target
        self.assertIn("stopped by signal %d" % signal.SIGTERM, out)

    def test_a_run_that_never_reaches_it_ends_at_the_limit(self):
        evals, reached, out, _, failed = self.run_fake("0.80,0.81", 1.0)
        self.assertIsNone(reached)
        self.assertEqual(len(evals), 2)
        self.assertIn("stopped by signal %d" % signal.SIGTERM, out)  # by the limit's timer
        self.assertFalse(failed)  # stopped at its limit: not reached, not failed

    def test_a_run_that_exits_with_an_error_failed(self):
        evals, reached, out, _, failed = job_runs.run_until(
            [sys.executable, "-c", "import sys; print('bad config'); sys.exit(2)"], 0.85, 60, self.log0)
        self.assertTrue(failed)
        self.assertEqual((evals, reached), ([], None))
        self.assertIn("bad config", out)

    def test_bad_arguments_are_refused_before_anything_runs(self):
        import argparse
        good = dict(models="small", extra_models="large", links="loopback,1gbit", cells="1x2", extra_cells="2x2",
                    extra_modes="BSP,lsgd4", target_metrics="", target_limits="")
        crossover_study.check_args(argparse.Namespace(**good))
        for key, bad in (("models", "huge"), ("links", "5parsecs"), ("cells", "2y4"), ("cells", "0x2"),
                         ("extra_modes", "SSP"), ("target_metrics", "small=x"), ("target_limits", "tiny=9")):
            with self.assertRaises(SystemExit, msg="%s=%s" % (key, bad)):
                crossover_study.check_args(argparse.Namespace(**dict(good, **{key: bad})))

    def test_a_results_line_that_is_not_json_is_named(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"link": "loopback", "mode": "probe"}\n\nnot json\n')
        try:
            with self.assertRaisesRegex(ValueError, r"line 3: not JSON"):
                crossover_study.load(f.name)
        finally:
            os.unlink(f.name)

    def test_target_overrides(self):
        self.assertEqual(crossover_study.parse_pairs("small=0.8,ctr=0.7", float), {"small": 0.8, "ctr": 0.7})
        with self.assertRaises(SystemExit):
            crossover_study.parse_pairs("tiny=0.8", float)
        with self.assertRaises(SystemExit):
            crossover_study.parse_pairs("small", float)

    def test_report_gives_ratios_to_centralized_and_the_misses(self):
        def row(mode, s, w, secs, epochs, best):
            return dict(link="1gbit", model="small", mode=mode, servers=s, workers=w, kind="target", target=0.85,
                        limit_s=90, seconds_to_target=secs, epochs_to_target=epochs, best_metric=best)
        text = crossover_study.target_report([row("centralized", 0, 1, 2.0, 2, 0.86), row("async", 1, 2, 4.0, 2, 0.85),
                                              row("async", 2, 4, None, None, 0.8312)])
        self.assertIn("| centralized | 2.0 (2) |", text)
        self.assertIn("| async 1x2 | 4.0 (2) 0.50x |", text)
        self.assertIn("| async 2x4 | not in 90 s (best 0.8312) |", text)

    def test_the_faster_centralized_run_is_the_base(self):
        # Time to target: the all-core run (1.0 s) is the faster centralized one.
        def row(mode, s, w, secs):
            return dict(link="1gbit", model="large", mode=mode, servers=s, workers=w, kind="target", target=0.84,
                        limit_s=90, seconds_to_target=secs, epochs_to_target=1, best_metric=0.85)
        text = crossover_study.target_report([row("centralized", 0, 1, 2.0), row("centralized-all-cores", 0, 1, 1.0),
                                              row("lsgd4", 2, 2, 4.0)])
        self.assertIn("| centralized | 2.0 (1) 0.50x |", text)
        self.assertIn("| centralized-all-cores | 1.0 (1) |", text)
        self.assertIn("| lsgd4 2x2 | 4.0 (1) 0.25x |", text)

        # Samples/s: the all-core run (150) is the base; the socket's 1x1 is a row of its own.
        def run(mode, s, w, rate):
            return dict(link="loopback", model="large", mode=mode, servers=s, workers=w, samples_per_s=rate,
                        steps=10, steps_per_worker=10, samples=100, bytes_sent=0, bytes_received=0, wall_s=1.0,
                        train_s=1.0, cpu_total_s=1.0, cpu_s={"worker 0": 1.0}, pull_s=0.0, compute_s=0.5, push_s=0.1)
        text = crossover_study.report([run("centralized", 0, 1, 100.0), run("centralized-all-cores", 0, 1, 150.0),
                                       run("async", 1, 2, 300.0), run("async-socket", 1, 1, 75.0)], 2)
        self.assertIn("| centralized | - | 100 (0.67x) |", text)
        self.assertIn("| centralized-all-cores | - | 150 |", text)
        self.assertIn("| async | 1x2 | 300 (2.00x) |", text)
        self.assertIn("| async-socket | 1x1 | 75 (0.50x) |", text)


class ParseRunTest(unittest.TestCase):
    def test_the_workers_json_logs_and_the_launchers_byte_and_cpu_lines(self):
        records = [
            dict(type="throughput", worker=0, epoch=0, step=10, time_s=1.0, samples=640, samples_per_s=640, loss=1.0),
            dict(type="eval", worker=0, epoch=1, step=3752, time_s=60.0, samples=240000, examples=10000, loss=0.4,
                 accuracy=0.85),
            dict(type="done", worker=0, steps=3752, samples=240000, wall_s=61.5, samples_per_s=3902, pull_s=0.04625,
                 compute_s=1.015, push_s=0.26025, data_s=0.2385, wait_s=0, prefetch=False),
            dict(type="done", worker=1, steps=10, samples=2560, wall_s=2.5, samples_per_s=1024, pull_s=62,
                 compute_s=10e-6, push_s=0, data_s=0, wait_s=0, prefetch=False),
        ]
        out = ("[worker 1@h1] sent 1000 bytes, received 3000 bytes\n"
               "[worker 1@h1] samples/s 1 wall_s 2.6\n"  # the final report: not read
               "[server 0@h2] 0m1.250s 0m0.250s\n")
        r = job_runs.parse_run(out, records)
        self.assertEqual((r["steps"], r["samples"]), (3762, 242560))
        self.assertAlmostEqual(r["train_s"], 61.5)
        self.assertAlmostEqual(r["pull_s"], 0.04625 + 62)
        self.assertAlmostEqual(r["compute_s"], 1.015 + 10e-6)
        self.assertAlmostEqual(r["push_s"], 0.26025)
        self.assertEqual(r["worker_rates"], [3902.0, 1024.0])
        self.assertEqual(r["final_metric"], 0.85)
        self.assertEqual((r["bytes_sent"], r["bytes_received"]), (1000, 3000))
        self.assertEqual(r["cpu_s"], {"server 0": 1.5})
        self.assertAlmostEqual(r["samples_per_s"], 242560 / 61.5)

    def test_read_logs_reads_every_workers_file_and_names_a_bad_line(self):
        d = tempfile.mkdtemp()
        try:
            for j in range(2):
                with open(os.path.join(d, "worker-%d.jsonl" % j), "w") as f:
                    f.write(json.dumps(dict(type="done", worker=j, steps=1, samples=j, wall_s=1, samples_per_s=j,
                                            pull_s=0, compute_s=0, push_s=0)) + "\n\n")
            self.assertEqual([r["worker"] for r in job_runs.read_logs(d)], [0, 1])
            with open(os.path.join(d, "worker-2.jsonl"), "w") as f:
                f.write("not json\n")
            with self.assertRaisesRegex(ValueError, r"worker-2.jsonl line 1: not JSON"):
                job_runs.read_logs(d)
        finally:
            shutil.rmtree(d)

    def test_launch_argv_gives_every_worker_its_own_log(self):
        d = tempfile.mkdtemp()
        try:
            argv = job_runs.launch_argv(["server 127.0.0.1 port=0", "worker 127.0.0.1"], "c.textproto", [], "/bin",
                                        d, "", "never")
            self.assertIn("--worker_arg=--log_path=%s/logs/worker-{index}.jsonl" % d, argv)
        finally:
            shutil.rmtree(d)


def validate_rows(rows):
    """advise_validation.validate of a study file holding `rows`."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    try:
        return advise_validation.validate(f.name, 64, ROOT)
    finally:
        os.unlink(f.name)


class ValidateTest(unittest.TestCase):
    def test_predicts_each_run_of_a_study_file_from_the_same_windows_inputs(self):
        key = advise_validation.exchange_key(203560, 203560)
        rows = [
            dict(link="loopback", mode="probe", rtt_s=0.0, bandwidth_Bps=1e12, exchange_s={key: 0.0002}),
            dict(link="loopback", model="small", mode="centralized", servers=0, workers=1, steps=100, compute_s=1.0,
                 push_s=0.2, pull_s=0.0, samples_per_s=5000.0),
            # The input: a step's transfers on loopback, 2 ms.
            dict(link="loopback", model="small", mode="async", servers=1, workers=1, steps=100, compute_s=1.0,
                 push_s=0.1, pull_s=0.1, samples_per_s=1000.0, bytes_sent=1, bytes_received=1),
            dict(link="loopback", model="small", mode="async", servers=1, workers=2, steps=200, compute_s=2.0,
                 push_s=0.2, pull_s=0.2, samples_per_s=4000.0, bytes_sent=200 * 203560, bytes_received=200 * 203560),
            dict(link="loopback", model="small", mode="async", kind="target", servers=1, workers=1),
        ]
        out, grpc = validate_rows(rows)
        self.assertAlmostEqual(grpc["small"]["grpc_step"], 0.002)
        # Only the 1x2 run is predicted: the 1x1 run is the input, the target row no throughput run.
        self.assertEqual([(r["servers"], r["workers"]) for r in out], [(1, 2)])
        r = out[0]
        expected = 2 * 64 / (0.010 + 0.002)  # two workers, each compute + the loopback transfers
        self.assertAlmostEqual(r["predicted"], expected, places=3)
        self.assertAlmostEqual(r["error"], expected / 4000 - 1, places=6)
        self.assertAlmostEqual(r["bytes_measured"], 2 * 203560)
        self.assertTrue(math.isclose(r["measured_vs_central"], 0.8))

    def test_links_between_hosts_take_the_step_by_the_socket(self):
        key = advise_validation.exchange_key(203560, 203560)

        def run(link, mode, s, w, steps, transfers, rate):
            return dict(link=link, model="small", mode=mode, servers=s, workers=w, steps=steps, compute_s=steps * 0.01,
                        push_s=transfers / 2, pull_s=transfers / 2, samples_per_s=rate, bytes_sent=1, bytes_received=1)

        rows = [
            dict(link="loopback", mode="probe", rtt_s=0.0, bandwidth_Bps=1e12, exchange_s={key: 0.0}),
            dict(link="10gbit", mode="probe", rtt_s=0.0, bandwidth_Bps=1e12, exchange_s={key: 0.0}),
            dict(link="loopback", model="small", mode="centralized", servers=0, workers=1, steps=100, compute_s=1.0,
                 push_s=0.0, pull_s=0.0, samples_per_s=6400.0),
            dict(link="10gbit", model="small", mode="centralized", servers=0, workers=1, steps=100, compute_s=1.0,
                 push_s=0.0, pull_s=0.0, samples_per_s=6400.0),
            run("loopback", "async", 1, 1, 100, 0.2, 1000.0),         # 2 ms a step through shared memory
            run("loopback", "async-socket", 1, 1, 100, 0.6, 900.0),   # 6 ms by the socket
            run("loopback", "async", 1, 2, 200, 0.4, 4000.0),
            run("10gbit", "async", 1, 2, 200, 0.4, 4000.0),
        ]
        out, grpc = validate_rows(rows)
        self.assertAlmostEqual(grpc["small"]["grpc_step"], 0.002)
        self.assertAlmostEqual(grpc["small"]["socket_step"], 0.006)
        # Neither 1x1 run is predicted; the loopback 1x2 from the shared-memory step, the 10gbit
        # one from the socket's.
        self.assertEqual([(r["link"], r["mode"], r["workers"]) for r in out],
                         [("loopback", "async", 2), ("10gbit", "async", 2)])
        self.assertAlmostEqual(out[0]["predicted"], 2 * 64 / (0.010 + 0.002), places=3)
        self.assertAlmostEqual(out[1]["predicted"], 2 * 64 / (0.010 + 0.006), places=3)


def bench_row(mode, op, payload, **values):
    r = dict(mode=mode, op=op, payload=payload, calls_per_s=0, mb_per_s=0, rows_per_s=0, vs_tcp=None)
    r.update(values)
    return r


class DataPathTargetsTest(unittest.TestCase):
    """data_path_targets turns ps_bench's, shard_benchmark's, ps_load's and scaling_bench's
    output into met / not met against the issue's goals."""

    ONE = [bench_row("tcp", "req_reply", "4KB", calls_per_s=20000),
           bench_row("grpc", "push", "4KB", mb_per_s=40, vs_tcp=0.51),
           bench_row("grpc", "pull", "4KB", mb_per_s=50, vs_tcp=0.49),
           bench_row("grpc", "push", "1MB", mb_per_s=1000, vs_tcp=0.9),
           bench_row("grpc", "pull", "1MB", mb_per_s=1300, vs_tcp=0.95),
           bench_row("grpc", "sparse_pull", "10k keys", rows_per_s=5.2e6),
           bench_row("grpc", "sparse_push", "10k keys", rows_per_s=4.0e6)]

    def by_target(self, rows):
        return {r["target"]: r for r in rows}

    def test_the_host_handoff_is_read_from_handoff_probes_report(self):
        report = ("size     way       us per round (write + read), 3 measurements of 0.3 s\n"
                  "64KB     plain          10.0      12.0      11.0\n"
                  "1MB      plain         520.5     140.0     530.0\n"
                  "1MB      streamed       80.0      75.5      90.0\n")
        self.assertEqual(targets.parse_handoff_probe(report), {"plain": 520.5, "streamed": 80.0})
        self.assertEqual(targets.parse_handoff_probe(report, "64KB"), None)  # no streamed line
        self.assertEqual(targets.parse_handoff_probe("bad size '3MB'\n"), None)
        with tempfile.TemporaryDirectory() as bin_dir:
            self.assertIsNone(targets.host_handoff(bin_dir))  # not built: no line printed

    def test_the_binaries_a_run_needs_are_checked_before_it_starts(self):
        with tempfile.TemporaryDirectory() as bin_dir:
            self.assertEqual(targets.missing_binaries(bin_dir, False, False),
                             ["bench/ps_bench", "server/shard_benchmark"])
            self.assertEqual(targets.missing_binaries(bin_dir, True, True),
                             ["bench/ps_bench", "server/shard_benchmark", "bench/ps_load",
                              "server/ps_server", "worker/ps_worker"])
            for name, mode in (("bench/ps_bench", 0o755), ("server/shard_benchmark", 0o644)):
                os.makedirs(os.path.join(bin_dir, os.path.dirname(name)), exist_ok=True)
                with open(os.path.join(bin_dir, name), "w"):
                    pass
                os.chmod(os.path.join(bin_dir, name), mode)
            # A file that is not executable is as missing as no file.
            self.assertEqual(targets.missing_binaries(bin_dir, False, False), ["server/shard_benchmark"])

    def test_the_congestion_control_is_read_from_the_kernel_setting(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tcp_congestion_control")
            with open(path, "w") as f:
                f.write("bbr\n")
            self.assertEqual(targets.congestion_control(path), "bbr")
            with open(path, "w"):
                pass
            self.assertEqual(targets.congestion_control(path), "unknown")
            self.assertEqual(targets.congestion_control(os.path.join(tmp, "absent")), "unknown")

    def test_transport_ratios_and_verdicts(self):
        window8 = [bench_row("grpc", "push", "4KB", calls_per_s=21000),
                   bench_row("grpc", "pull", "4KB", calls_per_s=19000)]
        rows = self.by_target(targets.transport_rows(self.ONE, window8))
        self.assertEqual(rows["dense 4KB push, 1 in flight, vs raw TCP"]["met"], "met")
        self.assertEqual(rows["dense 4KB pull, 1 in flight, vs raw TCP"]["met"], "not met")
        self.assertEqual(rows["dense 64MB pull, 1 in flight, vs raw TCP"]["met"], "not measured")
        slower = rows["dense 1MB push time / pull time"]
        self.assertAlmostEqual(slower["ratio"], 1.3)  # 1300 / 1000: push 1.3x slower than pull
        self.assertEqual(slower["met"], "not met")  # the goal is <= 1.2
        self.assertAlmostEqual(rows["dense 4KB push, 8 in flight, vs raw TCP 1 in flight"]["ratio"], 1.05)
        self.assertEqual(rows["dense 4KB pull, 8 in flight, vs raw TCP 1 in flight"]["met"], "not met")
        self.assertEqual(rows["sparse 10k keys x 16 pull, rows/s"]["met"], "met")
        self.assertAlmostEqual(rows["sparse 10k keys x 16 push, rows/s"]["ratio"], 0.8)

    def test_two_plus_two_against_one_plus_one(self):
        two = [bench_row("grpc", "push", "1MB", mb_per_s=1600), bench_row("grpc", "pull", "1MB", mb_per_s=1300)]
        rows = self.by_target(targets.scaling_rows([(self.ONE, two)]))
        self.assertAlmostEqual(rows["2+2 vs 1+1, dense 1MB push, aggregate MB/s"]["ratio"], 1.6)
        self.assertEqual(rows["2+2 vs 1+1, dense 1MB push, aggregate MB/s"]["met"], "met")
        self.assertEqual(rows["2+2 vs 1+1, dense 1MB pull, aggregate MB/s"]["met"], "not met")
        self.assertEqual(rows["2+2 vs 1+1, dense 64MB push, aggregate MB/s"]["met"], "not measured")

    def test_two_plus_two_is_the_median_round_each_against_its_own_one_plus_one(self):
        def session(push):
            return [bench_row("grpc", "push", "1MB", mb_per_s=push)]
        # Round ratios 2.0 (a slow 1 + 1), 1.2 and 1.4: the median round, with its own figures.
        rounds = [(session(600), session(1200)), (session(1000), session(1200)),
                  (session(1000), session(1400))]
        r = self.by_target(targets.scaling_rows(rounds))["2+2 vs 1+1, dense 1MB push, aggregate MB/s"]
        self.assertAlmostEqual(r["ratio"], 1.4)
        self.assertEqual(r["measured"], "1400 vs 1000 MB/s (median of 2.00, 1.20, 1.40)")

    def test_two_plus_two_shows_the_cores_each_session_kept_busy(self):
        # 1 + 1: 100 calls/s x (7,000 + 12,000 us) = 1.9 cores; 2 + 2: 110 x (6,000 + 11,000).
        one = [bench_row("grpc", "push", "64MB", mb_per_s=6400, calls_per_s=100,
                         client_cpu_us_per_call=7000, server_cpu_us_per_call=12000)]
        two = [bench_row("grpc", "push", "64MB", mb_per_s=7040, calls_per_s=110,
                         client_cpu_us_per_call=6000, server_cpu_us_per_call=11000)]
        r = self.by_target(targets.scaling_rows([(one, two)]))["2+2 vs 1+1, dense 64MB push, aggregate MB/s"]
        self.assertAlmostEqual(r["ratio"], 1.1)
        self.assertEqual(r["measured"], "7040 vs 6400 MB/s; cores busy 1.87 vs 1.90 of %d" % os.cpu_count())
        # Rows without CPU figures say nothing of cores, and rounds that tie on the ratio still
        # give a median.
        plain = [bench_row("grpc", "push", "64MB", mb_per_s=6400, calls_per_s=100)]
        tied = self.by_target(targets.scaling_rows([(plain, plain), (one, one)]))
        self.assertEqual(tied["2+2 vs 1+1, dense 64MB push, aggregate MB/s"]["ratio"], 1.0)
        self.assertIsNone(targets.cores_busy(plain[0]))

    def test_adam_uses_the_fastest_repetition_of_each_and_ignores_aggregates(self):
        benchmarks = [dict(name="BM_AdamPush64MB/0/real_time", run_type="iteration", real_time=t)
                      for t in (14.0, 12.0)]
        benchmarks += [dict(name="BM_AdamPush64MB/1/real_time", run_type="iteration", real_time=t)
                       for t in (8.0, 7.5)]
        benchmarks.append(dict(name="BM_AdamPush64MB/1/real_time_mean", run_type="aggregate", real_time=1.0))
        r = targets.adam_row(benchmarks)
        self.assertAlmostEqual(r["ratio"], 1.6)
        self.assertEqual(r["met"], "met")
        self.assertEqual(targets.adam_row(benchmarks[:2])["met"], "not measured")

    def test_adam_prefers_the_paired_benchmark_and_its_median_ratio(self):
        pairs = [dict(name="BM_PairAdamPush64MB/manual_time", run_type="iteration", speedup=v,
                      ms_1=13.0, ms_2=8.0, ceiling=1.9, GBps_1=37.8, GBps_2=48.7)
                 for v in (1.2, 1.7, 1.65)]
        pairs.append(dict(name="BM_PairAdamPush64MB/manual_time_median", run_type="aggregate", speedup=9.0))
        r = targets.adam_row(pairs + [dict(name="BM_AdamPush64MB/0/real_time", run_type="iteration",
                                           real_time=100.0)])
        self.assertAlmostEqual(r["ratio"], 1.65)
        self.assertEqual(r["met"], "met")
        self.assertEqual(r["measured"], "8.0 vs 13.0 ms (48.7 vs 37.8 GB/s; the Adam-shaped stream's 2/1 1.90x)")

    def test_adam_text_is_the_median_repetitions_with_the_iterations_where_the_stream_scaled(self):
        pairs = [dict(name="BM_PairAdamPush64MB/manual_time", run_type="iteration", speedup=v,
                      ms_1=ms_1, ms_2=13.0, ceiling=1.4, GBps_1=40.0, GBps_2=50.0, n_2c=n,
                      speedup_2c=s2c, iterations=30)
                 for v, ms_1, n, s2c in ((1.5, 19.5, 9, 1.7), (1.1, 14.3, 0, 0.0),
                                         (1.3, 16.9, 4, 1.62))]
        r = targets.adam_row(pairs)
        self.assertAlmostEqual(r["ratio"], 1.3)
        self.assertEqual(r["met"], "not met")
        self.assertEqual(r["measured"], "13.0 vs 16.9 ms (50.0 vs 40.0 GB/s; the Adam-shaped "
                         "stream's 2/1 1.40x; 1.62x in the 4 of 30 iterations where the stream "
                         "ran >= 1.5x)")
        # No iteration where the stream scaled: nothing said of them.
        self.assertNotIn("iterations where", targets.adam_row(pairs[1:2])["measured"])

    def test_memory_counts_the_optimizer_slots(self):
        text = ("ps_load: 1 servers, 2 clients, 21 tables x 4194304 floats (ADAM), 10 s\n"
                "  server 0: RSS 300 MiB before, 1100 MiB after, peak 1200 MiB "
                "(parameters only: 336 MiB per server before slots)\n")
        [r] = targets.memory_rows(text)
        self.assertAlmostEqual(r["ratio"], 1200 / (336 * 3))
        self.assertEqual(r["met"], "met")
        self.assertEqual(targets.memory_rows(text.replace("ADAM", "SGD"))[0]["met"], "not met")

    def test_training_against_centralized(self):
        records = [dict(mode="centralized", servers=0, workers=1, samples_per_s=10000, comm=None),
                   dict(mode="distributed", servers=1, workers=1, samples_per_s=7000, comm=0.9),
                   dict(mode="distributed", servers=2, workers=2, samples_per_s=7000, comm=1.4)]
        rows = self.by_target(targets.training_rows([records]))
        self.assertEqual(rows["training 1+1 vs centralized samples/s"]["met"], "met")
        self.assertEqual(rows["training 2+2 vs centralized samples/s"]["met"], "not met")
        self.assertEqual(rows["training 1+1 worst worker (pull+push)/compute"]["met"], "met")
        self.assertEqual(rows["training 2+2 worst worker (pull+push)/compute"]["met"], "not met")
        self.assertIn("| met |", targets.table(list(rows.values())))

    def test_training_rows_are_medians_over_runs_each_against_its_own_centralized_run(self):
        def run(central, one, two, comm):
            return [dict(mode="centralized", servers=0, workers=1, samples_per_s=central, comm=None),
                    dict(mode="distributed", servers=1, workers=1, samples_per_s=one, comm=0.5),
                    dict(mode="distributed", servers=2, workers=2, samples_per_s=two, comm=comm)]
        # 2+2 ratios 0.50, 0.90, 0.85 -> median 0.85 (met); comm 1.4, 0.9, 0.8 -> 0.9 (met).
        rows = self.by_target(targets.training_rows(
            [run(10000, 7000, 5000, 1.4), run(10000, 7000, 9000, 0.9), run(20000, 14000, 17000, 0.8)]))
        r = rows["training 2+2 vs centralized samples/s"]
        self.assertAlmostEqual(r["ratio"], 0.85)
        self.assertEqual(r["met"], "met")
        self.assertIn("17000 vs 20000 samples/s (median of 0.50, 0.90, 0.85)", r["measured"])
        self.assertAlmostEqual(rows["training 2+2 worst worker (pull+push)/compute"]["ratio"], 0.9)
        # A run without its centralized row counts for nothing.
        rows = self.by_target(targets.training_rows([run(0, 7000, 5000, 1.4)]))
        self.assertEqual(rows["training 2+2 vs centralized samples/s"]["met"], "not measured")

    def test_training_with_prefetch_shows_exposed_communication_too(self):
        records = [dict(mode="centralized", servers=0, workers=1, samples_per_s=10000, comm=None, exposed=None),
                   dict(mode="distributed", servers=1, workers=1, samples_per_s=7000, comm=2.5, exposed=0.8)]
        rows = self.by_target(targets.training_rows([records]))
        self.assertEqual(rows["training 1+1 worst worker (pull+push)/compute"]["met"], "not met")
        self.assertEqual(rows["training 1+1 worst worker exposed communication/compute"]["met"], "met")


class ScalingBenchTest(unittest.TestCase):
    """Communication over compute, two ways, from the workers' "done" records."""

    @staticmethod
    def done(worker, prefetch, **times):
        rec = dict(type="done", worker=worker, steps=10, samples=640, wall_s=1.0, samples_per_s=640.0,
                   pull_s=0.0, compute_s=1.0, push_s=0.0, data_s=0.0, wait_s=0.0, prefetch=prefetch)
        rec.update(times)
        return rec

    def test_without_prefetch_both_are_the_calls(self):
        rec = self.done(0, False, pull_s=0.1, push_s=1.9, comm_s=2.0, exposed_comm_s=2.0)
        self.assertEqual(scaling_bench.comm_ratios(rec), (2.0, 2.0))

    def test_with_prefetch_staging_alone_is_not_communication(self):
        # pull_s + push_s are the step loop's share (0.3); the calls took 2.5 s in the
        # background and the steps waited 1.5 s of them.
        rec = self.done(0, True, pull_s=0.2, push_s=0.1, wait_s=1.5, comm_s=2.5, exposed_comm_s=1.8)
        self.assertEqual(scaling_bench.comm_ratios(rec), (2.5, 1.8))

    def test_old_logs_with_prefetch_have_no_call_time(self):
        rec = self.done(0, True, pull_s=0.2, push_s=0.1, wait_s=1.5)
        calls, exposed = scaling_bench.comm_ratios(rec)
        self.assertIsNone(calls)
        self.assertAlmostEqual(exposed, 1.8)

    def test_parse_takes_the_worst_worker_of_each(self):
        records = [self.done(0, True, comm_s=2.5, exposed_comm_s=0.5),
                   self.done(1, True, comm_s=1.5, exposed_comm_s=1.2)]
        _, _, comm, exposed, times = scaling_bench.parse(records)
        self.assertEqual((comm, exposed), (2.5, 1.2))
        self.assertEqual([t["worker"] for t in times], [0, 1])

    def test_the_rate_is_the_jobs_not_the_sum_of_the_workers_own(self):
        # Worker 1 starts 0.5 s after worker 0 and trains 2 s; worker 0 trains 2 s, then
        # evaluates for 1 s (left out). 1280 samples over 2.5 s, not 640/2 + 640/2 per second.
        records = [self.done(0, False, start_unix_s=1000.0, wall_s=3.0, eval_s=1.0, samples_per_s=320.0),
                   self.done(1, False, start_unix_s=1000.5, wall_s=2.0, eval_s=0.0, samples_per_s=320.0)]
        rate, _, _, _, _ = scaling_bench.parse(records)
        self.assertAlmostEqual(rate, 1280 / 2.5)
        # Logs without starts (older binaries): the sum, as before.
        for rec in records:
            del rec["start_unix_s"]
        rate, _, _, _, _ = scaling_bench.parse(records)
        self.assertAlmostEqual(rate, 640.0)

    def test_local_sgd_rows_give_the_jobs_rate_too(self):
        records = [self.done(0, False, start_unix_s=1000.0, wall_s=3.0, eval_s=1.0, samples_per_s=320.0),
                   self.done(1, False, start_unix_s=1000.5, wall_s=2.0, eval_s=0.0, samples_per_s=320.0),
                   dict(type="eval", worker=0, time_s=2.5, accuracy=0.9)]
        out = "[worker 0@h] sent 100 bytes, received 200 bytes\n"
        row = local_sgd_study.run_row("async", 1, 0.88, out, records)
        self.assertAlmostEqual(row["samples_per_s"], 1280 / 2.5)
        self.assertEqual((row["seconds_to_target"], row["accuracy"]), (2.5, 0.9))
        self.assertEqual((row["bytes_sent"], row["bytes_received"]), (100, 200))
        # Logs without starts: every sample over the longest worker's time, not 640 + 640.
        for rec in records[:2]:
            del rec["start_unix_s"]
        self.assertAlmostEqual(local_sgd_study.run_row("async", 1, 0.88, out, records)["samples_per_s"],
                               1280 / 3.0)


if __name__ == "__main__":
    unittest.main()
