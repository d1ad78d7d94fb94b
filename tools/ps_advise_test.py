#!/usr/bin/env python3
"""Tests of tools/ps_advise.py (bytes per step, the prediction's limits, the link probe) and of
tools/crossover_study.py's time-to-target parts (evaluation lines, stopping a run at the target
or at its limit, the report)."""

import json
import math
import os
import signal
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import crossover_study  # noqa: E402
import ps_advise  # noqa: E402

MNIST = os.path.join(HERE, "..", "configs", "fashion_mnist_2x2_async.textproto")


def mlp_cfg(hidden, batch=64):
    return ps_advise.apply_sets(ps_advise.parse_textproto(ps_advise.read_text(MNIST)),
                                ["model.mlp.hidden=%s" % ",".join(map(str, hidden)),
                                 "training.batch_size=%d" % batch])


def ctr_cfg(vocab, fields, dim):
    return {"model": [{"ctr": [{"embedding_dim": [str(dim)]}]}],
            "data": [{"synthetic": [{"vocabulary_per_field": [str(vocab)], "num_fields": [str(fields)],
                                     "zipf_exponent": ["1.1"]}]}]}


# A step's pull + push on loopback (22 ms) and the same bytes over raw TCP there (none), round
# numbers so that each limit can be computed by hand.
GRPC = dict(grpc_step=0.022, loopback_exchange_s=0.0)


def step(compute=0.010, apply=0.002, nbytes=1e6):
    return dict(compute=compute, apply=apply, pull=0.0, kind="mlp", pull_bytes=nbytes, push_bytes=nbytes)


def pick(preds, mode, s, w):
    return [p for p in preds if p["mode"] == mode and p["servers"] == s and p["workers"] == w][0]


class ModelBytesTest(unittest.TestCase):
    def test_mlp_moves_every_weight_and_bias_each_way(self):
        kind, pull, push, keys, params = ps_advise.model_bytes(mlp_cfg([64]), 64)
        self.assertEqual(kind, "mlp")
        self.assertEqual(params, 784 * 64 + 64 + 64 * 10 + 10)
        self.assertEqual((pull, push, keys), (4 * params, 4 * params, 0))

    def test_ctr_batch_of_one_touches_one_row_per_field(self):
        _, pull, push, keys, _ = ps_advise.model_bytes(ctr_cfg(1000, 8, 16), 1)
        self.assertAlmostEqual(keys, 8, places=6)
        self.assertAlmostEqual(pull, 8 * (8 + 4 * 16) + 4 * 17, places=3)
        self.assertEqual(pull, push)

    def test_ctr_unique_keys_grow_with_the_batch_but_never_past_the_vocabulary(self):
        prev = 0
        for batch in (1, 16, 256, 4096, 1 << 20):
            keys = ps_advise.model_bytes(ctr_cfg(50, 4, 8), batch)[3]
            self.assertGreater(keys, prev)
            self.assertLessEqual(keys, 4 * 50 + 1e-6)
            prev = keys
        self.assertGreater(prev, 4 * 50 - 1)

    def test_a_local_sgd_period_moves_the_whole_mlp_but_fewer_than_k_times_the_rows(self):
        self.assertEqual(ps_advise.period_bytes(mlp_cfg([64]), 64, (4,)), {4: 1.0})
        ratio = ps_advise.period_bytes(ctr_cfg(100000, 8, 32), 256, (4,))[4]
        self.assertGreater(ratio, 1.5)  # most keys of a batch are rare: a period has more rows ...
        self.assertLess(ratio, 4.0)     # ... but popular ones repeat across its batches

    def test_step_bytes_reads_the_overrides(self):
        self.assertEqual(ps_advise.step_bytes(MNIST, ["model.mlp.hidden=64"]), (203560, 203560))


class PredictTest(unittest.TestCase):
    def assertClose(self, a, b, rel=1e-4):
        self.assertLess(abs(a - b), rel * abs(b), "%r is not within %g of %r" % (a, rel, b))

    def test_centralized_is_the_batch_over_its_step(self):
        preds = ps_advise.predict(step(), GRPC, dict(bandwidth_Bps=1e12, rtt_s=0), 64, [1], [1], 64)
        self.assertClose(preds[0]["samples_per_s"], 64 / 0.012)

    def test_one_worker_on_many_cores_is_bound_by_its_step(self):
        link = dict(bandwidth_Bps=1e12, rtt_s=0)
        p = pick(ps_advise.predict(step(), GRPC, link, 64, [1], [1], 64), "async", 1, 1)
        # compute + the loopback step's transfers (the server's apply is inside the push)
        self.assertClose(p["samples_per_s"], 64 / (0.010 + 0.022))
        self.assertIn("per-worker step", p["bound"])

    def test_the_link_adds_the_wire_time_and_round_trips(self):
        link = dict(bandwidth_Bps=100e6, rtt_s=0.001)
        p = pick(ps_advise.predict(step(), GRPC, link, 64, [1], [1], 64), "async", 1, 1)
        self.assertClose(p["samples_per_s"], 64 / (0.010 + 0.022 + 2e6 / 100e6 + 0.002))

    def test_a_slow_link_caps_the_servers_links(self):
        link = dict(bandwidth_Bps=1e6, rtt_s=0)  # 1 MB/s: 2 s per step for the bytes alone
        p = pick(ps_advise.predict(step(), GRPC, link, 64, [4], [2], 64), "async", 2, 4)
        self.assertEqual(p["bound"], "the servers' links")
        self.assertClose(p["samples_per_s"], 64 * 2 * 1e6 / 2e6)

    def test_shared_cores_cap_the_cluster(self):
        link = dict(bandwidth_Bps=1e12, rtt_s=0)
        p = pick(ps_advise.predict(step(), GRPC, link, 1, [4], [1], 64, cpu_factor=2.0), "async", 1, 4)
        self.assertIn("CPU (1 cores for 5 processes)", p["bound"])
        self.assertClose(p["samples_per_s"], 64 / (0.010 + 2.0 * 0.022))

    def test_local_sgd_moves_the_transfers_to_one_step_in_k(self):
        link = dict(bandwidth_Bps=1e12, rtt_s=0)
        preds = ps_advise.predict(step(), GRPC, link, 64, [1], [1], 64, ks=(4,))
        # Every step: compute and the worker's own optimizer; the transfers once in 4 steps.
        self.assertClose(pick(preds, "local SGD k=4", 1, 1)["samples_per_s"], 64 / (0.010 + 0.002 + 0.022 / 4))

    def test_local_sgd_on_a_sparse_model_moves_a_periods_rows(self):
        link = dict(bandwidth_Bps=1e12, rtt_s=0)
        m = dict(step(), period_bytes={4: 2.5})
        preds = ps_advise.predict(m, GRPC, link, 64, [1], [1], 64, ks=(4,))
        self.assertClose(pick(preds, "local SGD k=4", 1, 1)["samples_per_s"], 64 / (0.010 + 0.002 + 0.022 * 2.5 / 4))

    def test_bsp_is_slower_than_async_by_the_straggler_allowance(self):
        link = dict(bandwidth_Bps=1e12, rtt_s=0)
        preds = ps_advise.predict(step(), GRPC, link, 64, [3], [1], 64, straggler=0.1)
        a, b = pick(preds, "async", 1, 3)["samples_per_s"], pick(preds, "BSP", 1, 3)["samples_per_s"]
        self.assertClose(b, a / 1.2)

    def test_a_measured_exchange_replaces_the_rate_for_the_workers_step(self):
        m = step()
        g = dict(grpc_step=0.022, loopback_exchange_s=0.1)
        # The rate alone says 2 s per step; the link's measured time for this step's bytes was
        # 0.5 s (a token bucket that lets a burst through, say), 0.1 s of it also on loopback.
        link = dict(bandwidth_Bps=1e6, rtt_s=0, exchange_s={ps_advise.exchange_key(1e6, 1e6): 0.5})
        p = pick(ps_advise.predict(m, g, link, 64, [1], [1], 64), "async", 1, 1)
        self.assertClose(p["samples_per_s"], 64 / (0.010 + 0.022 + 0.4))
        # An exchange measured for other bytes is not used.
        link["exchange_s"] = {ps_advise.exchange_key(2e6, 2e6): 0.5}
        p = pick(ps_advise.predict(m, g, link, 64, [1], [1], 64), "async", 1, 1)
        self.assertClose(p["samples_per_s"], 64 / (0.010 + 0.022 + 2.0))

    def test_recommends_centralized_unless_a_cluster_is_clearly_faster(self):
        preds = [dict(mode="centralized", servers=0, workers=1, samples_per_s=100, bound="compute"),
                 dict(mode="async", servers=1, workers=2, samples_per_s=105, bound="x")]
        self.assertEqual(ps_advise.recommend(preds, 1.1)[0]["mode"], "centralized")
        preds[1]["samples_per_s"] = 150
        self.assertEqual(ps_advise.recommend(preds, 1.1)[0]["mode"], "async")


class ProbeTest(unittest.TestCase):
    def test_loopback_probe_measures_rate_round_trip_and_exchanges(self):
        r = ps_advise.probe_link([], [], "127.0.0.1", port=0, nbytes=1 << 20,
                                 exchanges=[(1000, 200000), (300000, 10)], repeat=3)
        self.assertGreater(r["bandwidth_Bps"], 0)
        self.assertGreater(r["rtt_s"], 0)
        self.assertEqual(sorted(r["exchange_s"]), ["1000x200000", "300000x10"])
        for v in r["exchange_s"].values():
            self.assertGreater(v, 0)
            self.assertLess(v, 10)


# A job that would go on training after its evaluations: only SIGTERM ends it. SIGTERM is
# blocked and taken with sigwait, never handled by printing from a handler (a handler runs
# between any two bytecodes, also inside a print, and printing there fails with "reentrant
# call").
FAKE_RUN = r"""
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
for epoch, metric in enumerate([float(v) for v in sys.argv[1].split(",")], 1):
    print("[worker 1@h] worker 1  epoch %d  test accuracy 0.9999  loss 0.1  (0.1 s)" % epoch, flush=True)
    print("[worker 0@h] worker 0  epoch %d  test accuracy %.4f  loss 0.3  (%.1f s)" % (epoch, metric, epoch * 1.5),
          flush=True)
signum = signal.sigwait({signal.SIGTERM})
print("stopped by signal %d" % signum, flush=True)
"""


class TimeToTargetTest(unittest.TestCase):
    def test_eval_lines_of_both_kinds_of_model(self):
        m = crossover_study.EVAL_LINE.search("[worker 0@ns-w0] worker 0  epoch 3  test accuracy 0.8512  loss 0.4  (7.5 s)")
        self.assertEqual(m.groups(), ("3", "0.8512", "7.5"))
        m = crossover_study.EVAL_LINE.search("worker 0  epoch 2  test AUC 0.8237  log-loss 0.4735  (4.1 s)")
        self.assertEqual(m.groups(), ("2", "0.8237", "4.1"))
        self.assertIsNone(crossover_study.EVAL_LINE.search("worker 1  epoch 2  test AUC 0.9  log-loss 0.4  (4.1 s)"))

    def test_stops_the_run_at_the_first_evaluation_reaching_the_target(self):
        evals, reached, out, _, failed = crossover_study.run_until(
            [sys.executable, "-c", FAKE_RUN, "0.80,0.84,0.86,0.90"], 0.85, 3600)  # no limit in a test's time
        self.assertEqual(reached, (3, 0.86, 4.5))
        self.assertFalse(failed)
        self.assertEqual([e[0] for e in evals], [1, 2, 3])  # none counted after the target
        self.assertIn("stopped by signal %d" % signal.SIGTERM, out)

    def test_a_run_that_never_reaches_it_ends_at_the_limit(self):
        evals, reached, out, _, failed = crossover_study.run_until(
            [sys.executable, "-c", FAKE_RUN, "0.80,0.81"], 0.85, 1.0)
        self.assertIsNone(reached)
        self.assertEqual(len(evals), 2)
        self.assertIn("stopped by signal %d" % signal.SIGTERM, out)  # by the limit's timer
        self.assertFalse(failed)  # stopped at its limit: not reached, not failed

    def test_a_run_that_exits_with_an_error_failed(self):
        evals, reached, out, _, failed = crossover_study.run_until(
            [sys.executable, "-c", "import sys; print('bad config'); sys.exit(2)"], 0.85, 60)
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


class ParseRunTest(unittest.TestCase):
    def test_the_workers_summaries_with_every_duration_format(self):
        out = ("[worker 0@h0] I1130 03:30:48.300982 10172 worker_main.cc:280] worker 0: 3752 steps, 240000 samples in "
               "1m1.5s (3902 samples/s; data 238.5ms, pull 46.25ms, compute 1.015s, push 260.25ms, wait 0)\n"
               "[worker 1@h1] I1130 03:30:48.300982 10172 worker_main.cc:280] worker 1: 10 steps, 2560 samples in 2.5s "
               "(1024 samples/s; data 0, pull 1m2s, compute 10us, push 0, wait 0)\n"
               "[worker 1@h1] samples/s 1024 wall_s 2.6\n"
               "[worker 1@h1] sent 1000 bytes, received 3000 bytes\n"
               "[server 0@h2] 0m1.250s 0m0.250s\n")
        r = crossover_study.parse_run(out)
        self.assertEqual((r["steps"], r["samples"]), (3762, 242560))
        self.assertAlmostEqual(r["train_s"], 61.5)
        self.assertAlmostEqual(r["pull_s"], 0.04625 + 62)
        self.assertAlmostEqual(r["compute_s"], 1.015 + 10e-6)
        self.assertAlmostEqual(r["push_s"], 0.26025)
        self.assertEqual((r["bytes_sent"], r["bytes_received"]), (1000, 3000))
        self.assertEqual(r["cpu_s"], {"server 0": 1.5})
        self.assertAlmostEqual(r["samples_per_s"], 242560 / 61.5)


class ValidateTest(unittest.TestCase):
    def test_predicts_each_run_of_a_study_file_from_the_same_windows_inputs(self):
        key = ps_advise.exchange_key(203560, 203560)
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
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        try:
            out, grpc = ps_advise.validate(f.name, 64)
        finally:
            os.unlink(f.name)
        self.assertAlmostEqual(grpc["small"]["grpc_step"], 0.002)
        # Only the 1x2 run is predicted: the 1x1 run is the input, the target row no throughput run.
        self.assertEqual([(r["servers"], r["workers"]) for r in out], [(1, 2)])
        r = out[0]
        expected = 2 * 64 / (0.010 + 0.002)  # two workers, each compute + the loopback transfers
        self.assertAlmostEqual(r["predicted"], expected, places=3)
        self.assertAlmostEqual(r["error"], expected / 4000 - 1, places=6)
        self.assertAlmostEqual(r["bytes_measured"], 2 * 203560)
        self.assertTrue(math.isclose(r["measured_vs_central"], 0.8))


ROOT = os.path.dirname(HERE)


@unittest.skipUnless(os.path.exists(os.path.join(ROOT, "server", "ps_server")) and
                     os.path.exists(os.path.join(ROOT, "worker", "ps_worker")), "needs the built binaries")
class AdviseTest(unittest.TestCase):
    def test_measures_a_real_job_and_recommends(self):
        config = os.path.join(ROOT, "configs", "ctr_synthetic_2x2.textproto")
        sets = ["data.synthetic.num_train=20000", "data.synthetic.num_test=2000"]
        rep = ps_advise.advise(config, sets, ROOT, cores=2, max_workers=2, servers=(1,), steps=20)
        self.assertEqual(rep["kind"], "ctr")
        self.assertGreater(rep["grpc"]["grpc_step"], 0)
        self.assertGreater(rep["compute"]["compute"], 0)
        modes = [(p["mode"], p["servers"], p["workers"]) for p in rep["predictions"]]
        self.assertEqual(modes, [("centralized", 0, 1), ("async", 1, 1), ("local SGD k=4", 1, 1), ("async", 1, 2),
                                 ("BSP", 1, 2), ("local SGD k=4", 1, 2)])
        for p in rep["predictions"]:
            self.assertGreater(p["samples_per_s"], 0)
        self.assertIn(rep["recommendation"], rep["predictions"])


if __name__ == "__main__":
    unittest.main()
