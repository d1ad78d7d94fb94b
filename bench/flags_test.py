#!/usr/bin/env python3
"""ps_bench and ps_load refuse out-of-range flags (counts, sizes, seconds, windows, ports) with a
message naming the flag and its range, before they start a server."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))

from flag_check import check_refusals  # noqa: E402

PS_BENCH = os.path.join(ROOT, "bench", "ps_bench")
PS_LOAD = os.path.join(ROOT, "bench", "ps_load")
HANDOFF_PROBE = os.path.join(ROOT, "bench", "handoff_probe")


class PsBenchFlagsTest(unittest.TestCase):
    def test_out_of_range_flags_are_refused(self):
        check_refusals(self, PS_BENCH, [
            (["--servers=0"], "--servers=0: expected 1..256"),
            (["--servers=-3"], "--servers=-3: expected"),
            (["--clients=0"], "--clients=0: expected 1..1024"),
            (["--clients=1,-2"], "--clients=-2: expected"),
            (["--window=0"], "--window=0: expected"),
            (["--repeat=0"], "--repeat=0: expected"),
            (["--seconds=-1"], "--seconds=-1: expected"),
            (["--seconds=0"], "--seconds=0: expected"),
            (["--warmup=-0.5"], "--warmup=-0.5: expected"),
            (["--payloads=0KB"], "--payloads=0KB: expected"),
            (["--payloads=4096MB"], "--payloads=4096MB: expected 1 B .. 1024 MB"),
            (["--payloads=6B"], "--payloads: 6B is not whole floats"),
            (["--sparse_dim=0"], "--sparse_dim=0: expected"),
            (["--key_space=0"], "--key_space=0: expected"),
            (["--key_space=-1"], "key_space"),
            (["--sparse_keys=1000", "--key_space=10"], "--sparse_keys: 1000 keys per call from a --key_space of 10"),
            (["--spill_budgets=101"], "--spill_budgets=101: expected 1..100"),
            (["--zipf=-1"], "--zipf=-1: expected"),
            (["--apply_threads=-2"], "--apply_threads=-2: expected -1..1024"),
            (["--apply_threads=1025"], "--apply_threads=1025: expected -1..1024"),
            (["--tcp_stream_write=0"], "--tcp_stream_write=0: expected"),
            (["--connect=127.0.0.1:99999", "--config=x"], "'127.0.0.1:99999' is not host:port"),
            (["--modes=gpu"], "--modes: unknown mode 'gpu'"),
            (["--modes=echo", "--echo_apis=async"], "--echo_apis: unknown API 'async'"),
            (["--handoff=fast"], "--handoff=fast: expected adaptive, plain or streamed"),
        ])

    def test_server_settings_reach_the_written_config(self):
        with tempfile.TemporaryDirectory() as d:
            def written(extra):
                path = os.path.join(d, "config.textproto")
                subprocess.run([PS_BENCH, "--servers=1", "--write_config=" + path] + extra,
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL, timeout=60)
                with open(path) as f:
                    return f.read()

            self.assertNotIn("apply_threads", written([]))
            text = written(["--apply_threads=1", "--data_threads=2"])
            self.assertRegex(text, r"server \{[^}]*apply_threads: 1")
            self.assertRegex(text, r"server \{[^}]*data_threads: 2")


class PsLoadFlagsTest(unittest.TestCase):
    def test_out_of_range_flags_are_refused(self):
        check_refusals(self, PS_LOAD, [
            (["--servers=0"], "--servers=0: expected 1..256"),
            (["--clients=-3"], "--clients=-3: expected"),
            (["--tables=0"], "--tables=0: expected"),
            (["--table_floats=0"], "--table_floats=0: expected"),
            (["--table_floats=1000000000000"], "--table_floats=1000000000000: expected"),
            (["--seconds=0"], "--seconds=0: expected"),
            (["--checkpoint_interval=-7"], "--checkpoint_interval=-7: expected"),
            (["--optimizer=NEWTON"], "--optimizer=NEWTON is not one of"),
        ])


class HandoffProbeFlagsTest(unittest.TestCase):
    def test_out_of_range_flags_are_refused(self):
        check_refusals(self, HANDOFF_PROBE, [
            (["--sizes=0KB"], "--sizes=0KB: expected 1 B .. 1024 MB"),
            (["--sizes=2048MB"], "--sizes=2048MB: expected 1 B .. 1024 MB"),
            (["--sizes=1MB,100B"], "--sizes: 100B is not a multiple of 64 bytes"),
            (["--sizes=abc"], "--sizes: bad size 'abc'"),
            (["--rounds=0"], "--rounds=0: expected 1..1000"),
            (["--seconds=0"], "--seconds=0: expected more than 0"),
            (["--cpus=1"], "--cpus wants two cpu numbers"),
            (["--cpus=-1,0"], "--cpus wants two cpu numbers"),
        ])


if __name__ == "__main__":
    unittest.main()
