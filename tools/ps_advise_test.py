#!/usr/bin/env python3
"""Tests of tools/ps_advise.py: bytes per step, the prediction's limits, the link probe, and a
whole advice from a real loopback job."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ps_advise  # noqa: E402

ROOT = os.path.dirname(HERE)
MNIST = os.path.join(ROOT, "configs", "fashion_mnist_2x2_async.textproto")


def mlp_cfg(hidden, batch=64):
    return ps_advise.load(ROOT, MNIST, ["model.mlp.hidden=%s" % ",".join(map(str, hidden)),
                                        "training.batch_size=%d" % batch])


def ctr_cfg(vocab, fields, dim):
    return {"model": {"ctr": {"embedding_dim": dim}},
            "data": {"synthetic": {"vocabulary_per_field": str(vocab), "num_fields": fields, "zipf_exponent": 1.1}}}


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
        self.assertEqual(ps_advise.step_bytes(ROOT, MNIST, ["model.mlp.hidden=64"]), (203560, 203560))


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
        # 8 workers on 2 servers: each server's link carries 1 MB of pushes in and 1 MB of
        # pulls out per step, at once, at 1 MB/s each way (the workers' own steps allow 252/s).
        p = pick(ps_advise.predict(step(), GRPC, link, 64, [8], [2], 64), "async", 2, 8)
        self.assertEqual(p["bound"], "the servers' links")
        self.assertClose(p["samples_per_s"], 64 * 2 * 1e6 / 1e6)
        # Its busier direction bounds it.
        m = dict(step(), push_bytes=0.5e6)
        p = pick(ps_advise.predict(m, GRPC, link, 64, [8], [2], 64), "async", 2, 8)
        self.assertEqual(p["bound"], "the servers' links")
        self.assertClose(p["samples_per_s"], 64 * 2 * 1e6 / 1e6)
        m = dict(step(), pull_bytes=0.25e6, push_bytes=0.5e6)
        p = pick(ps_advise.predict(m, GRPC, link, 64, [8], [2], 64), "async", 2, 8)
        self.assertEqual(p["bound"], "the servers' links")
        self.assertClose(p["samples_per_s"], 64 * 2 * 1e6 / 0.5e6)

    def test_a_model_of_few_blocks_loads_one_servers_link(self):
        # The MLP 784-64-10 is 4 blocks of 65536 values (one per table) on 2 servers: server 0
        # holds layer0.w and layer1.w, 50816 of its 50890 values.
        cfg = mlp_cfg([64])
        self.assertAlmostEqual(ps_advise.busiest_server_share(cfg, 2), 50816 / 50890)
        self.assertEqual(ps_advise.busiest_server_share(cfg, 1), 1.0)
        # 784-2048-2048-10: 5.8M values in 93 blocks, nearly even.
        self.assertAlmostEqual(ps_advise.busiest_server_share(mlp_cfg([2048, 2048]), 2), 0.5, places=2)
        # Two workers on two servers of a link whose exchange was measured: with the bytes
        # spread evenly, each server's link carries one worker's worth and the measured step
        # holds it; with all of them on one server, its link carries two workers' bytes.
        link = dict(bandwidth_Bps=1e6, rtt_s=0, exchange_s={ps_advise.exchange_key(1e6, 1e6): 1.0})
        even = pick(ps_advise.predict(dict(step(), server_share={2: 0.5}), GRPC, link, 64, [2], [2], 64),
                    "async", 2, 2)
        self.assertIn("per-worker step", even["bound"])
        self.assertClose(even["samples_per_s"], 2 * 64 / (0.010 + 0.022 + 1.0))
        one = pick(ps_advise.predict(dict(step(), server_share={2: 1.0}), GRPC, link, 64, [2], [2], 64),
                   "async", 2, 2)
        self.assertEqual(one["bound"], "the servers' links")
        self.assertClose(one["samples_per_s"], 64 * 1e6 / 1e6)

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

    def test_centralized_on_every_core_is_predicted_beside_one_thread(self):
        m = dict(step(), all_cores=dict(compute=0.004, apply=0.002, pull=0.0, threads=2))
        preds = ps_advise.predict(m, GRPC, dict(bandwidth_Bps=1e12, rtt_s=0), 2, [1], [1], 64)
        self.assertEqual([p["mode"] for p in preds[:2]], ["centralized", "centralized, all cores"])
        self.assertClose(preds[0]["samples_per_s"], 64 / 0.012)
        self.assertClose(preds[1]["samples_per_s"], 64 / 0.006)
        # A cluster 1.5x the one-thread run but not 1.1x the all-core one: the all-core run.
        preds.append(dict(mode="async", servers=1, workers=2, samples_per_s=1.5 * 64 / 0.012, bound="x"))
        choice, why = ps_advise.recommend(preds, 1.1)
        self.assertEqual(choice["mode"], "centralized, all cores")
        self.assertIn("centralized, all cores", why)
        preds[-1]["samples_per_s"] = 1.2 * 64 / 0.006
        self.assertEqual(ps_advise.recommend(preds, 1.1)[0]["mode"], "async")

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




class TransportTest(unittest.TestCase):
    """A cluster on one host passes calls through shared memory; between hosts there is only the
    socket, so a step measured on loopback for a link between hosts must go by the socket."""

    def setUp(self):
        self.saved = {k: getattr(ps_advise, k) for k in ("measure_compute", "measure_step", "probe_link",
                                                          "launch_argv")}

    def tearDown(self):
        for k, v in self.saved.items():
            setattr(ps_advise, k, v)

    def advise_on(self, bandwidth=1e9, **kw):
        seen = []
        ps_advise.measure_compute = lambda *a, **k: dict(compute=0.01, apply=0.001, pull=0.0, step=0.011, batch=64,
                                                         samples_per_s=5800.0)

        def measure_step(bin_dir, config, sets, steps, shared_memory=True):
            seen.append(shared_memory)
            return 0.002

        def probe_link(server, client, addr, port=7001, exchanges=(), **_):
            return dict(bandwidth_Bps=bandwidth, rtt_s=1e-4,
                        exchange_s={ps_advise.exchange_key(*e): 0.001 for e in exchanges})

        ps_advise.measure_step, ps_advise.probe_link = measure_step, probe_link
        kw = dict(dict(cores=2, max_workers=1, servers=(1,)), **kw)
        self.rep = ps_advise.advise(MNIST, ["model.mlp.hidden=64"], ROOT, **kw)
        return seen, self.rep["grpc"]["transport"]

    def test_the_step_goes_by_the_socket_for_a_link_between_hosts(self):
        self.assertEqual(self.advise_on(link_spec="1gbit"), ([False], "socket"))
        self.assertEqual(self.advise_on(probe=([], [], "10.0.0.1")), ([False], "socket"))

    def test_the_step_goes_through_shared_memory_on_one_host(self):
        self.assertEqual(self.advise_on(), ([True], "shared memory"))
        self.assertEqual(self.advise_on(link_spec="loopback"), ([True], "shared memory"))

    def test_the_blocks_placement_reaches_the_prediction(self):
        # The MLP 784-64-10 is 99.9% on one of two servers: with two workers, that server's
        # link (100 KB/s here) carries both workers' bytes although a probed link's exchange
        # is measured and there are no more workers than servers.
        self.advise_on(bandwidth=1e5, probe=([], [], "10.0.0.1"), max_workers=2, servers=(2,))
        p = pick(self.rep["predictions"], "async", 2, 2)
        self.assertEqual(p["bound"], "the servers' links")
        share = ps_advise.busiest_server_share(mlp_cfg([64]), 2)
        self.assertAlmostEqual(p["samples_per_s"] / (64 * 1e5 / (share * 203560)), 1.0, places=6)

    def test_measure_step_turns_shared_memory_off_for_the_socket(self):
        calls = []

        class Stop(Exception):
            pass

        def launch_argv(hosts, config, sets, *rest):
            calls.append(list(sets))
            raise Stop()

        ps_advise.launch_argv = launch_argv
        for shared in (False, True):
            with self.assertRaises(Stop):
                ps_advise.measure_step(ROOT, MNIST, ["model.mlp.hidden=64"], 5, shared_memory=shared)
        self.assertIn("rpc.shared_memory_mb=0", calls[0])
        self.assertNotIn("rpc.shared_memory_mb=0", calls[1])


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
        all_cores = [("centralized, all cores", 0, 1)] if (os.cpu_count() or 1) > 1 else []
        self.assertEqual(modes, [("centralized", 0, 1)] + all_cores +
                         [("async", 1, 1), ("local SGD k=4", 1, 1), ("async", 1, 2), ("BSP", 1, 2),
                          ("local SGD k=4", 1, 2)])
        for p in rep["predictions"]:
            self.assertGreater(p["samples_per_s"], 0)
        self.assertIn(rep["recommendation"], rep["predictions"])


if __name__ == "__main__":
    unittest.main()
