#!/usr/bin/env python3
"""launch_common.effective_config: the launchers read the job as the binaries do (the file with
--set applied by ps_server --print_config), so an override of the cluster's size is seen."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from launch_common import cluster_size, effective_config  # noqa: E402

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


if __name__ == "__main__":
    unittest.main()
