#!/usr/bin/env python3
"""count_tests.py counts test cases once: a sharded target's merged test.xml, not also its
shards' (each shard's cases are in both), and a target without shards as it is."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def write_xml(path, results):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cases = "".join(
        f'<testcase name="c{i}">{"<failure/>" if r == "failed" else "<skipped/>" if r == "skipped" else ""}</testcase>'
        for i, r in enumerate(results))
    with open(path, "w") as f:
        f.write(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")


class CountTestsTest(unittest.TestCase):
    def count(self, root):
        out = subprocess.run([sys.executable, os.path.join(HERE, "count_tests.py"), root],
                             check=True, capture_output=True, text=True).stdout
        return out.strip()

    def test_a_sharded_target_counts_its_merged_cases_once(self):
        with tempfile.TemporaryDirectory() as root:
            target = os.path.join(root, "server", "sharded_test")
            write_xml(os.path.join(target, "test.xml"), ["passed", "passed", "failed", "skipped"])
            write_xml(os.path.join(target, "shard_1_of_2", "test.xml"), ["passed", "failed"])
            write_xml(os.path.join(target, "shard_2_of_2", "test.xml"), ["passed", "skipped"])
            write_xml(os.path.join(root, "server", "plain_test", "test.xml"), ["passed"])
            self.assertEqual(self.count(root), "3 passed, 1 failed, 1 skipped")

    def test_shards_without_a_merged_file_are_counted(self):
        with tempfile.TemporaryDirectory() as root:
            target = os.path.join(root, "t")
            write_xml(os.path.join(target, "shard_1_of_2", "test.xml"), ["passed"])
            write_xml(os.path.join(target, "shard_2_of_2", "test.xml"), ["failed"])
            self.assertEqual(self.count(root), "1 passed, 1 failed, 0 skipped")


if __name__ == "__main__":
    unittest.main()
