#!/usr/bin/env python3
"""count_tests.py counts test cases once: a sharded target's merged test.xml, not also its
shards' (each shard's cases are in both), and a target without shards as it is; a target whose
cases passed but whose run failed (Bazel's test.cache_status) counts one failure more."""
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


def write_status(path, passed, status):
    """A test.cache_status as Bazel writes it: field 2 test_passed, field 3 the status, then a
    length-delimited field (a log's path) as Bazel's carry."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    log = b"/tmp/testlogs/x/test.log"
    with open(path, "wb") as f:
        f.write(bytes([0x10, int(passed), 0x18, status, 0x48, 0xEB, 0x05, 0x52, len(log)]) + log)


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

    def test_a_target_without_test_xml_counts_as_one_case(self):
        # (Counted as nothing before 2026-12-05: a run could print 0 failed while one failed.)
        with tempfile.TemporaryDirectory() as root:
            crashed = os.path.join(root, "t", "crashed_test")
            os.makedirs(crashed)
            open(os.path.join(crashed, "test.log"), "w").close()
            ran = os.path.join(root, "t", "ran_test")
            os.makedirs(ran)
            open(os.path.join(ran, "test.log"), "w").close()
            write_status(os.path.join(ran, "test.cache_status"), passed=True, status=1)
            write_xml(os.path.join(root, "t", "plain_test", "test.xml"), ["passed"])
            open(os.path.join(root, "t", "plain_test", "test.log"), "w").close()
            self.assertEqual(self.count(root), "2 passed, 1 failed, 0 skipped")

    def test_a_run_that_failed_after_its_cases_passed_is_a_failure(self):
        with tempfile.TemporaryDirectory() as root:
            leaked = os.path.join(root, "server", "leaks_at_exit_test")
            write_xml(os.path.join(leaked, "test.xml"), ["passed", "passed"])
            write_status(os.path.join(leaked, "test.cache_status"), passed=False, status=4)
            fine = os.path.join(root, "server", "fine_test")
            write_xml(os.path.join(fine, "test.xml"), ["passed"])
            write_status(os.path.join(fine, "test.cache_status"), passed=True, status=1)
            # A failed case already counts the failure: not twice.
            failing = os.path.join(root, "server", "failing_test")
            write_xml(os.path.join(failing, "test.xml"), ["passed", "failed"])
            write_status(os.path.join(failing, "test.cache_status"), passed=False, status=4)
            self.assertEqual(self.count(root), "4 passed, 2 failed, 0 skipped")


if __name__ == "__main__":
    unittest.main()
