#!/usr/bin/python3
"""A Python worker's life against real ps_server processes on 127.0.0.1 port 0: a restarted
worker resumes its clock and data position, a client needs its worker_index (a tool, -1, takes
no worker's place), and ps.cluster cleans up a start that fails and ties its servers to their
parent.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import junit  # noqa: E402
import ps  # noqa: E402
import ps.cluster  # noqa: E402
from client_test import config_text, rand  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# Worker 0 of a job at argv[1] on servers argv[2]: five steps, a data position, then gone
# without close() (os._exit skips the destructor too): a crash, which tells the servers nothing.
CRASHING_WORKER = """
import os, sys
import ps
c = ps.Client(sys.argv[1], servers=sys.argv[2].split(","), worker_index=0)
for _ in range(5):
    c.clock()
c.report_position(1, 640)
print(c.steps, flush=True)
os._exit(0)
"""


def worker_clocks(client):
    """[{worker id: (clock, live)}] per server."""
    return [{int(w.get("worker_id", 0)): (int(w["clock"]), bool(w.get("live"))) for w in s["worker_clocks"]}
            for s in client.stats()]


class RestartTest(unittest.TestCase):
    """A training worker's new client resumes at the clock the servers hold for it (as
    ps_worker does): before 2026-12-06 it counted from 0 again."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="ps-py-restart-", dir=os.environ.get("TEST_TMPDIR"))
        self.path = os.path.join(self.root, "job.textproto")
        with open(self.path, "w") as f:
            f.write(config_text(num_workers=2, staleness=0))
        self.addCleanup(shutil.rmtree, self.root, True)
        self.servers = ps.cluster.LocalServers(self.path, num_servers=2, server_args=["--exit_when_done=false"])
        self.servers.start()
        self.addCleanup(self.servers.stop)  # after the clients' close (cleanups run last first)

    def client(self, index):
        c = ps.Client(self.path, servers=self.servers.addresses, worker_index=index)
        self.addCleanup(c.close)
        return c

    def test_a_restarted_worker_resumes_its_clock_and_data_position(self):
        env = dict(os.environ, PYTHONPATH=HERE)
        done = subprocess.run([sys.executable, "-c", CRASHING_WORKER, self.path, ",".join(self.servers.addresses)],
                              env=env, stdout=subprocess.PIPE, timeout=120, check=True)
        self.assertEqual(done.stdout.split(), [b"5"])
        w0 = self.client(0)
        self.assertEqual(w0.steps, 5)  # (0 before 2026-12-06)
        self.assertEqual(w0.position(), ps.Position(1, 640, 5))
        self.assertEqual(w0.clock(), 6)
        for clocks in worker_clocks(w0):
            self.assertEqual(clocks[0], (6, True))
        # Worker 1 (BSP) is held back by worker 0's clock, not by a restart from 0: its six
        # steps' pulls all pass.
        w1 = self.client(1)
        for _ in range(6):
            w1.step(pull_dense=["d_out"])
        self.assertEqual(w1.steps, 6)

    def test_a_worker_started_again_after_it_finished_resumes_its_clock(self):
        # The servers take a new incarnation of a finished worker back into the bound with the
        # clock it finished at (WorkerTracker::Lookup): its client must start there too.
        w0 = ps.Client(self.path, servers=self.servers.addresses, worker_index=0)
        for _ in range(3):
            w0.clock()
        self.assertEqual(w0.report_position(0, 30), ps.Position(0, 30, 3))
        w0.close()  # finishes worker 0
        for clocks in worker_clocks(self.client(-1)):
            self.assertEqual(clocks[0], (3, False))
        again = self.client(0)
        self.assertEqual(again.steps, 3)
        self.assertEqual(again.position(), ps.Position(0, 30, 3))
        self.assertEqual(again.clock(), 4)
        for clocks in worker_clocks(again):
            self.assertEqual(clocks[0], (4, True))


class ToolClientTest(unittest.TestCase):
    """worker_index has no default (before 2026-12-06 it was 0: a client made to look took
    training worker 0's place); -1 is a tool outside the clock."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="ps-py-tool-", dir=os.environ.get("TEST_TMPDIR"))
        cls.path = os.path.join(cls.root, "job.textproto")
        with open(cls.path, "w") as f:
            f.write(config_text())
        # Outlives a worker 0 that finishes (the job's only worker).
        cls.servers = ps.cluster.LocalServers(cls.path, num_servers=2, server_args=["--exit_when_done=false"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.servers.stop()
        shutil.rmtree(cls.root, ignore_errors=True)

    def test_a_client_without_worker_index_raises_invalid_argument(self):
        with self.assertRaises(ps.InvalidArgument) as cm:
            ps.Client(self.path, servers=self.servers.addresses)
        self.assertIn("worker_index", cm.exception.message)
        self.assertIn("0..cluster.num_workers-1 for a training worker", cm.exception.message)
        self.assertIn("-1 for a tool", cm.exception.message)
        with self.assertRaises(ps.InvalidArgument):
            ps.Client(self.path, servers=self.servers.addresses, worker_index="0")

    def test_a_tool_client_that_pulls_does_not_disturb_worker_0(self):
        with ps.Client(self.path, servers=self.servers.addresses, worker_index=0) as w0:
            g = rand((5, 7), 12)
            before = w0.pull_dense("d_step")
            w0.push_dense("d_step", g)
            w0.clock()
            incarnations = [{w["worker_id"]: w["incarnation"] for w in s["worker_clocks"]} for s in w0.stats()]
            with ps.Client(self.path, servers=self.servers.addresses, worker_index=-1) as tool:
                self.assertEqual(tool.pull_dense("d_step").tobytes(), (before - g).tobytes())
                self.assertEqual(tool.position(), ps.Position(0, 0, 0))
                with self.assertRaises(ps.FailedPrecondition):
                    tool.report_position(1, 2)
            # The tool's pull and its close (a finish as -1) left worker 0 as it was: same
            # incarnation, live, and its next push is applied.
            w0.push_dense("d_step", g)
            self.assertEqual(w0.pull_dense("d_step").tobytes(), (before - g - g).tobytes())
            self.assertEqual(w0.clock(), w0.steps)
            for s, inc in zip(w0.stats(), incarnations):
                clocks = {w["worker_id"]: w for w in s["worker_clocks"]}
                self.assertEqual(clocks[0]["incarnation"], inc[0])
                self.assertTrue(clocks[0]["live"])


class LocalServersCleanupTest(unittest.TestCase):
    """A start that fails stops what it started and removes its data root (before 2026-12-06
    only a server that exited or stayed silent did; `with` never calls __exit__ when __enter__
    raises)."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="ps-py-cleanup-", dir=os.environ.get("TEST_TMPDIR"))
        self.path = os.path.join(self.root, "job.textproto")
        with open(self.path, "w") as f:
            f.write(config_text(num_workers=2))
        self.started = []
        self.addCleanup(shutil.rmtree, self.root, True)
        self.addCleanup(self.kill_started)

    def kill_started(self):
        for p in self.started:  # only what a broken start left running
            if p.poll() is None:
                p.kill()
                p.wait()

    def failing_popen(self, flag):
        """subprocess.Popen that raises for a command line with `flag` and records the others."""
        real = subprocess.Popen

        def popen(argv, *args, **kwargs):
            if flag in argv:
                raise OSError("injected: cannot start %s" % flag)
            p = real(argv, *args, **kwargs)
            self.started.append(p)
            return p
        return mock.patch("ps.cluster.subprocess.Popen", side_effect=popen)

    def test_a_server_that_fails_to_start_stops_the_ones_before_it(self):
        servers = ps.cluster.LocalServers(self.path, num_servers=2)
        self.addCleanup(lambda: servers.data_root and shutil.rmtree(servers.data_root, True))
        with self.failing_popen("--server_index=1"):
            with self.assertRaisesRegex(OSError, "injected"):
                with servers:
                    self.fail("started")
        self.assertEqual(len(self.started), 1)
        self.assertIsNotNone(self.started[0].returncode)  # waited for by stop()
        self.assertFalse(os.path.exists(servers.data_root))

    def test_run_job_ends_the_workers_started_before_one_that_fails(self):
        worker = [sys.executable, "-c", "import time; time.sleep(600)"]
        with self.failing_popen("--worker_index=1"):
            with self.assertRaisesRegex(OSError, "injected"):
                ps.cluster.run_job(self.path, worker, num_workers=2, num_servers=1)
        self.assertEqual(len(self.started), 2)  # the server and worker 0
        for p in self.started:
            self.assertIsNotNone(p.returncode)


GET_PDEATHSIG = """
import ctypes
sig = ctypes.c_int(-1)
ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
print(sig.value)
"""


class DieWithParentTest(unittest.TestCase):
    def test_the_child_gets_sigterm_as_parent_death_signal_without_loading_a_library(self):
        # libc is loaded at import: the child, between fork and exec, only calls prctl (a dlopen
        # there can wait for ever on a lock another thread held at the fork). Before 2026-12-06
        # the child loaded libc; with loading refused, it had no signal.
        with mock.patch("ps.cluster.ctypes.CDLL", side_effect=OSError("no dlopen after fork")):
            out = subprocess.run([sys.executable, "-c", GET_PDEATHSIG], stdout=subprocess.PIPE, timeout=60,
                                 check=True, preexec_fn=ps.cluster._die_with_this_process()).stdout
        self.assertEqual(int(out), int(ps.cluster.signal.SIGTERM))

    def test_a_child_whose_parent_is_already_gone_exits(self):
        # In the child: a parent pid that is not its parent's stands for a parent that died
        # between the fork and prctl (the child was reparented).
        code = ("import os, ps.cluster\n"
                "ps.cluster._die_with_parent(os.getppid() + 1)\n"
                "print('ran on')\n")
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=HERE),
                           stdout=subprocess.PIPE, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (1, b""))
        code = code.replace("os.getppid() + 1", "os.getppid()")
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=HERE),
                           stdout=subprocess.PIPE, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (0, b"ran on\n"))


if __name__ == "__main__":
    junit.main(__name__)
