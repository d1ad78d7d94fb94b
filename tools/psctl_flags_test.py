#!/usr/bin/env python3
"""psctl refuses out-of-range flags (deadlines, sampling intervals, ports) with a message naming
the flag and its range, before it reads the config or dials a server."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from flag_check import check_refusals  # noqa: E402

PSCTL = os.path.join(ROOT, "tools", "psctl")
CONFIG = "--config=" + os.path.join(ROOT, "configs", "fashion_mnist_2x2_async.textproto")


class PsctlFlagsTest(unittest.TestCase):
    def test_out_of_range_flags_are_refused(self):
        check_refusals(self, PSCTL, [
            (["status", CONFIG, "--timeout_s=-1"], "--timeout_s=-1: expected"),
            (["status", CONFIG, "--timeout_s=0"], "--timeout_s=0: expected"),
            (["status", CONFIG, "--rate_interval_s=0"], "--rate_interval_s=0: expected"),
            (["status", CONFIG, "--servers=127.0.0.1:99999"], "'127.0.0.1:99999' is not host:port"),
            (["status", CONFIG, "--servers=127.0.0.1:0"], "'127.0.0.1:0' is not host:port"),
            (["status", CONFIG, "--servers=nohost"], "'nohost' is not host:port"),
            (["restart", CONFIG], "unknown command 'restart'"),
            (["status"], "--config is required"),
        ])

    def test_a_shutdown_without_a_reason_is_refused(self):
        check_refusals(self, PSCTL, [(["shutdown", CONFIG, "--servers=127.0.0.1:1"], "shutdown needs --reason")])


if __name__ == "__main__":
    unittest.main()
