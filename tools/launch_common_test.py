#!/usr/bin/env python3
"""Tests of the launchers' signal handling: SIGINT/SIGTERM only set a flag (StopRequest), and
tools/launch_local.py acts on it from its main loop, stopping every process it started.

Seen before: the handlers printed through say(), which takes the output lock; a Ctrl-C landing
while the main thread held that lock deadlocked the launcher."""

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from launch_common import StopRequest, Stopped  # noqa: E402

# Stands in for ps_server / ps_worker: answers --print_config with a 2 x 2 cluster; a server
# writes its --port_file; both wait for SIGTERM
# (taken with sigwait, not a handler) and write a line to --mark_dir's file when they stop.
FAKE_BINARY = r"""#!/usr/bin/env python3
import os, signal, sys, time
if "--print_config" in sys.argv:  # what launch_local asks ps_server for the cluster's size
    print('{"cluster": {"num_servers": 2, "num_workers": 2}}')
    sys.exit(0)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
for arg in sys.argv[1:]:
    if arg.startswith("--port_file="):
        path = arg.split("=", 1)[1]
        with open(path + ".tmp", "w") as f:
            f.write("12345\n")
        os.rename(path + ".tmp", path)
print("fake started", flush=True)
signal.sigwait({signal.SIGTERM})
print("fake stopped", flush=True)
"""


class StopRequestTest(unittest.TestCase):
    def tearDown(self):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def test_signal_while_the_output_lock_is_held_only_sets_the_flag(self):
        out_lock = threading.Lock()
        stop = StopRequest()
        with out_lock:
            # The handler runs here, in this thread, with the lock held: it must not take it.
            os.kill(os.getpid(), signal.SIGINT)
            self.assertTrue(stop.requested())
        with self.assertRaises(Stopped) as raised:
            stop.check()
        self.assertEqual(raised.exception.signum, signal.SIGINT)

    def test_the_first_signal_is_kept(self):
        stop = StopRequest()
        stop.check()  # nothing yet
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        self.assertEqual(stop.signum, signal.SIGTERM)


class LaunchLocalSignalTest(unittest.TestCase):
    def test_sigint_stops_every_process_and_exits_130(self):
        root = tempfile.mkdtemp(prefix="launch-signal-")
        try:
            for sub, name in (("server", "ps_server"), ("worker", "ps_worker")):
                os.makedirs(os.path.join(root, "bin", sub))
                path = os.path.join(root, "bin", sub, name)
                with open(path, "w") as f:
                    f.write(FAKE_BINARY)
                os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
            config = os.path.join(root, "job.textproto")
            with open(config, "w") as f:
                f.write("cluster { num_servers: 2 num_workers: 2 }\n")
            launcher = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "launch_local.py"), config,
                 "--bin_dir=" + os.path.join(root, "bin"), "--data_root=" + os.path.join(root, "data")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines = []
            started = 0
            for line in launcher.stdout:
                lines.append(line)
                started += "fake started" in line
                if started == 4:  # 2 servers and 2 workers
                    break
            launcher.send_signal(signal.SIGINT)
            rest, _ = launcher.communicate(timeout=120)  # generous: fails only if it hangs
            out = "".join(lines) + rest
            self.assertEqual(launcher.returncode, 130, out)
            self.assertIn("signal %d: stopping every process" % signal.SIGINT, out)
            self.assertEqual(out.count("fake stopped"), 4, out)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
