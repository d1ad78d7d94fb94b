#!/usr/bin/env python3
"""launch_common.effective_config: the launchers read the job as the binaries do (the file with
--set applied by ps_server --print_config), so an override of the cluster's size is seen."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import tempfile  # noqa: E402

from launch_common import cluster_size, effective_config, worker_certificates  # noqa: E402

MNIST = os.path.join(ROOT, "configs", "fashion_mnist_2x2_async.textproto")


class EffectiveConfigTest(unittest.TestCase):
    def test_reads_the_files_counts(self):
        self.assertEqual(cluster_size(effective_config(ROOT, MNIST, [])), (2, 2))

    def test_sets_override_the_file_as_for_the_binaries(self):
        cfg = effective_config(ROOT, MNIST, ["cluster.num_workers=3", "training.epochs=7"])
        self.assertEqual(cluster_size(cfg), (2, 3))
        self.assertEqual(cfg["training"]["epochs"], 7)
        # The model's tables are in it, as the servers hold them.
        self.assertIn("mlp/layer0.w", [t["name"] for t in cfg["tables"]])

    def test_a_bad_override_is_the_binarys_error(self):
        with self.assertRaisesRegex(RuntimeError, "unknown field 'nope'"):
            effective_config(ROOT, MNIST, ["cluster.nope=1"])

    def test_counts_default_to_one_and_to_the_servers_listed(self):
        self.assertEqual(cluster_size({}), (1, 1))
        self.assertEqual(cluster_size({"cluster": {"servers": ["a:1", "b:1", "c:1"], "num_servers": 0}}),
                         (3, 1))


class WorkerCertificatesTest(unittest.TestCase):
    def test_each_worker_gets_the_certificate_naming_it(self):
        with tempfile.TemporaryDirectory() as d:
            for name in ("server.pem", "server.key", "worker-0.pem", "worker-0.key", "worker-1.pem", "worker-1.key"):
                open(os.path.join(d, name), "w").close()
            cfg = {"security": {"cert": os.path.join(d, "server.pem"), "plaintext": False}}
            ids = worker_certificates(cfg, 3)
            self.assertEqual(ids[1], ["security.cert=%s/worker-1.pem" % d, "security.key=%s/worker-1.key" % d])
            self.assertEqual(ids[2], [])  # no pair for worker 2: the config's own certificate

    def test_plaintext_jobs_get_nothing(self):
        self.assertEqual(worker_certificates({"security": {"plaintext": True, "cert": "/x/server.pem"}}, 2), [[], []])


if __name__ == "__main__":
    unittest.main()
