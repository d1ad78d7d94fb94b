#!/usr/bin/env python3
"""Unit tests of the launchers' own logic, with small Python scripts standing in for ps_server,
ps_worker and ssh: argument handling, the hosts file, the remote command line, supervision (a
child that exits non-zero stops the job with that code, every child is stopped and reaped) and
signals (SIGTERM to the launcher stops every child; the launcher exits 143, 128 + SIGTERM)."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import launch_ssh  # noqa: E402
from launch_common import exit_status, merge_sets, worker_args  # noqa: E402

# ps_server / ps_worker: --print_config answers a 1 x 2 cluster. Each writes its argv to
# FAKE_DIR. A server writes its --port_file and prints the line launch_ssh waits for; a worker
# exits with FAKE_EXIT_<index> (default 0). Both record their pid in FAKE_DIR and wait
# for SIGTERM (taken with sigwait) when they have nothing else to do.
FAKE_BINARY = r"""#!/usr/bin/env python3
import json, os, signal, sys, time
if "--print_config" in sys.argv:
    cfg = {"cluster": {"num_servers": 1, "num_workers": 2}}
    if os.environ.get("FAKE_CERT"):
        cfg["security"] = {"cert": os.environ["FAKE_CERT"]}
    print(json.dumps(cfg))
    sys.exit(0)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
role = "server" if "server_index" in flags else "worker"
index = flags.get(role + "_index")
out = os.environ["FAKE_DIR"]
with open(os.path.join(out, "%s-%s.argv" % (role, index)), "w") as f:
    json.dump(sys.argv[1:], f)
with open(os.path.join(out, "%s-%s.pid" % (role, index)), "w") as f:
    f.write(str(os.getpid()))
if role == "server":
    # FAKE_SERVER_CRASH=<code>: the first start exits with it once a worker runs (the launcher
    # restarts it); the restart writes server-<index>.restarted.
    crashed = os.path.join(out, "server-%s.crashed" % index)
    if os.environ.get("FAKE_SERVER_CRASH") and os.path.exists(crashed):
        open(os.path.join(out, "server-%s.restarted" % index), "w").close()
    if "port_file" in flags:
        with open(flags["port_file"] + ".tmp", "w") as f:
            f.write("12345\n")
        os.rename(flags["port_file"] + ".tmp", flags["port_file"])
    print("ps_server %s listening on 127.0.0.1:12345" % index, flush=True)
    if os.environ.get("FAKE_SERVER_CRASH") and not os.path.exists(crashed):
        os.rename(os.path.join(out, "server-%s.argv" % index), crashed)
        while not os.path.exists(os.path.join(out, "worker-0.pid")):
            time.sleep(0.01)
        sys.exit(int(os.environ["FAKE_SERVER_CRASH"]))
else:
    print("fake worker started", flush=True)
    # FAKE_WORKER_AFTER=<name>: runs until that file is in FAKE_DIR, then as below.
    after = os.environ.get("FAKE_WORKER_AFTER")
    while after and not os.path.exists(os.path.join(out, after)):
        time.sleep(0.01)
    code = os.environ.get("FAKE_EXIT_" + index)
    if code == "wait":
        pass
    elif code is not None:
        # Fail only once the others named in FAKE_READY have blocked SIGTERM (their pid files
        # are written after that), so that the launcher's SIGTERM reaches their sigwait.
        for name in filter(None, os.environ.get("FAKE_READY", "").split(",")):
            while not os.path.exists(os.path.join(out, name)):
                time.sleep(0.01)
        sys.exit(int(code))
    else:
        sys.exit(0)
signal.sigwait({signal.SIGTERM})
with open(os.path.join(out, "%s-%s.stopped" % (role, index)), "w") as f:
    f.write("SIGTERM")
"""

# What a failing fake worker waits for: the server and worker 0 ready for SIGTERM.
READY = "server-0.pid,worker-0.pid"

# ssh: skips its options and the host, then runs the remote command line locally.
FAKE_SSH = r"""#!/usr/bin/env python3
import os, subprocess, sys, time
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[2:] if args[0] == "-o" else args[1:]
host, command = args[0], " ".join(args[1:])
with open(os.path.join(os.environ["FAKE_DIR"], "ssh-hosts"), "a") as f:
    f.write(host + "\n")
if host == os.environ.get("FAKE_DROP_HOST") and " exec " in command:
    # The connection drops once the process started: ssh exits 255, the process runs on.
    subprocess.Popen(["sh", "-c", command], start_new_session=True)
    time.sleep(1)
    sys.exit(255)
os.execvp("sh", ["sh", "-c", command])
"""


def read(path):
    with open(path) as f:
        return f.read()


def write_script(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but not reaped; its parent (the launcher) has exited, so init reaps it.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Job:
    """A temporary directory with fake binaries, a fake ssh and a config."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="launchers-test-")
        self.out = os.path.join(self.root, "out")
        os.makedirs(self.out)
        for sub, name in (("server", "ps_server"), ("worker", "ps_worker")):
            write_script(os.path.join(self.root, "bin", sub, name), FAKE_BINARY)
        write_script(os.path.join(self.root, "path", "ssh"), FAKE_SSH)
        self.config = os.path.join(self.root, "job.textproto")
        with open(self.config, "w") as f:
            f.write("cluster { num_servers: 1 num_workers: 2 }\n")
        self.env = dict(os.environ, FAKE_DIR=self.out,
                        PATH=os.path.join(self.root, "path") + os.pathsep + os.environ["PATH"])

    def local_argv(self, *extra):
        return [sys.executable, os.path.join(HERE, "launch_local.py"), self.config,
                "--bin_dir=" + os.path.join(self.root, "bin"), "--data_root=" + os.path.join(self.root, "data"),
                "--stop_timeout=30"] + list(extra)

    def ssh_argv(self, *extra):
        hosts = os.path.join(self.root, "hosts")
        with open(hosts, "w") as f:
            f.write("server node-a port=0\nworker node-b\nworker node-c\n")
        return [sys.executable, os.path.join(HERE, "launch_ssh.py"), hosts, self.config,
                "--bin_dir=" + os.path.join(self.root, "bin"), "--remote_dir=" + os.path.join(self.root, "remote"),
                "--log_dir=" + os.path.join(self.root, "logs"), "--stop_timeout=30"] + list(extra)

    def run(self, argv, **env):
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(self.env, **env), timeout=300)  # generous: fails only if it hangs
        return p.returncode, p.stdout

    def start(self, argv, **env):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(self.env, **env))

    def pids(self):
        return [int(read(os.path.join(self.out, n))) for n in os.listdir(self.out) if n.endswith(".pid")]

    def exists(self, name):
        return os.path.exists(os.path.join(self.out, name))

    def cleanup(self):
        for pid in self.pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def set_flags(job, name):
    """The --set flags the fake process `name` ("worker-1") was started with."""
    return [a for a in json.loads(read(os.path.join(job.out, name + ".argv"))) if a.startswith("--set")]


def wait_for_line(proc, text, count):
    """Reads proc's output until `text` appeared count times; returns what was read."""
    lines, seen = [], 0
    for line in proc.stdout:
        lines.append(line)
        seen += text in line
        if seen == count:
            break
    return "".join(lines)


class HelpersTest(unittest.TestCase):
    def test_exit_status_keeps_the_childs_code_and_maps_signals(self):
        self.assertEqual(exit_status(3), 3)
        self.assertEqual(exit_status(-signal.SIGKILL), 128 + signal.SIGKILL)
        self.assertEqual(exit_status(0), 1)  # called only for a failure
        self.assertEqual(exit_status(None), 1)

    def test_worker_args_name_each_worker(self):
        self.assertEqual(worker_args(["--log_path=/t/w{index}.jsonl", "--eval=never"], 3),
                         ["--log_path=/t/w3.jsonl", "--eval=never"])

    def test_merge_sets_makes_one_set_flag_the_users_after_the_launchers(self):
        # The binaries keep only the last --set flag: a user's --server_arg=--set=... dropped
        # the launcher's (cluster.num_workers, a worker's certificate).
        counts = ["cluster.num_servers=1", "cluster.num_workers=2"]
        self.assertEqual(
            merge_sets(["training.epochs=3", "security.cert=/c/worker-0.pem"],
                       ["--eval=never", "--set=model.mlp.hidden=256,128,security.cert=/mine.pem",
                        "-set=a=1", "--set", "b=2"], counts),
            (["--set=training.epochs=3,security.cert=/c/worker-0.pem,model.mlp.hidden=256,128,"
              "security.cert=/mine.pem,a=1,b=2,cluster.num_servers=1,cluster.num_workers=2"], ["--eval=never"]))
        self.assertEqual(merge_sets([], ["--port=1"]), ([], ["--port=1"]))
        self.assertEqual(merge_sets([], ["--set=cluster.num_workers=2"], counts)[0],
                         ["--set=cluster.num_workers=2,cluster.num_servers=1,cluster.num_workers=2"])
        with self.assertRaisesRegex(ValueError, "the launcher runs this job with cluster.num_workers=2"):
            merge_sets([], ["--set=cluster.num_workers=3"], counts)


class HostsFileTest(unittest.TestCase):
    def parse(self, text):
        return launch_ssh.parse_hosts(text, 7000, "/d", "/b")

    def test_indices_defaults_and_options(self):
        servers, workers = self.parse("# role host\nserver a addr=10.0.0.1 port=0\nserver b\nworker c bin_dir=/o\n"
                                      "worker a  # same host again\n")
        self.assertEqual([(s["index"], s["host"], s["addr"], s["port"], s["data_dir"]) for s in servers],
                         [(0, "a", "10.0.0.1", 0, "/d/server-0"), (1, "b", "b", 7000, "/d/server-1")])
        self.assertEqual([(w["index"], w["host"], w["bin_dir"]) for w in workers], [(0, "c", "/o"), (1, "a", "/b")])

    def test_bad_lines_are_refused_with_their_number(self):
        for text, message in (("server a\n", "need at least one server line and one worker line"),
                              ("server a\nmaster b\nworker c\n", "line 2: expected"),
                              ("server a port=70000\nworker c\n", "line 1: port=70000 is not a port"),
                              ("server a port=-1\nworker c\n", "line 1: port=-1 is not a port"),
                              ("server a\nworker c port=1\n", "line 2: port= is for servers"),
                              ("server a color=red\nworker c\n", "line 1: bad option 'color=red'")):
            with self.subTest(text=text):
                with self.assertRaisesRegex(launch_ssh.HostsError, message):
                    self.parse(text)

    def test_ssh_gets_one_quoted_command_other_exec_commands_separate_arguments(self):
        self.assertEqual(launch_ssh.exec_argv("ssh -o BatchMode=yes {host}", "h1", "echo 'a b'", None),
                         ["ssh", "-o", "BatchMode=yes", "h1", "sh -c 'echo '\"'\"'a b'\"'\"''"])
        self.assertEqual(launch_ssh.exec_argv("ip netns exec {host}", "ns1", "echo x", None),
                         ["ip", "netns", "exec", "ns1", "sh", "-c", "echo x"])
        self.assertEqual(launch_ssh.exec_argv("", "h", "echo x", None), ["sh", "-c", "echo x"])


class LaunchLocalTest(unittest.TestCase):
    def setUp(self):
        self.job = Job()

    def tearDown(self):
        self.job.cleanup()

    def test_a_finished_job_stops_the_servers_and_exits_0(self):
        code, out = self.job.run(self.job.local_argv("--worker_arg=--log_path=/tmp/w{index}.jsonl"))
        self.assertEqual(code, 0, out)
        self.assertIn("all 2 workers finished; stopping the servers", out)
        self.assertTrue(self.job.exists("server-0.stopped"), out)
        argv = read(os.path.join(self.job.out, "worker-1.argv"))
        self.assertIn("--log_path=/tmp/w1.jsonl", argv)
        self.assertIn("--worker_index=1", argv)

    def test_a_failing_worker_stops_the_job_with_its_code(self):
        code, out = self.job.run(self.job.local_argv(), FAKE_EXIT_0="wait", FAKE_EXIT_1="3", FAKE_READY=READY)
        self.assertEqual(code, 3, out)
        self.assertIn("worker 1 failed with exit code 3; stopping the job", out)
        # The others were stopped (SIGTERM) and reaped before the launcher exited.
        self.assertTrue(self.job.exists("server-0.stopped"), out)
        self.assertTrue(self.job.exists("worker-0.stopped"), out)
        self.assertFalse([p for p in self.job.pids() if alive(p)])

    def test_sigterm_stops_every_process_and_exits_143(self):
        launcher = self.job.start(self.job.local_argv(), FAKE_EXIT_0="wait", FAKE_EXIT_1="wait")
        out = wait_for_line(launcher, "fake worker started", 2)
        launcher.send_signal(signal.SIGTERM)
        rest, _ = launcher.communicate(timeout=120)
        out += rest
        self.assertEqual(launcher.returncode, 143, out)
        self.assertIn("signal %d: stopping every process" % signal.SIGTERM, out)
        for name in ("server-0", "worker-0", "worker-1"):
            self.assertTrue(self.job.exists(name + ".stopped"), out)
        self.assertFalse([p for p in self.job.pids() if alive(p)])

    def test_argument_errors_are_named(self):
        code, out = self.job.run(self.job.local_argv()[:2] + ["/no/such.textproto",
                                                              "--bin_dir=" + os.path.join(self.job.root, "bin")])
        self.assertNotEqual(code, 0)
        self.assertIn("no config file /no/such.textproto", out)
        code, out = self.job.run(self.job.local_argv("--bin_dir=/nonexistent"))
        self.assertNotEqual(code, 0)
        self.assertIn("/nonexistent/server/ps_server not found", out)
        for flag, message in (("--workers=0", "--workers must be at least 1"),
                              ("--restart_workers=-1", "--restart_workers must not be negative"),
                              ("--stop_timeout=0", "--stop_timeout must be positive")):
            code, out = self.job.run(self.job.local_argv(flag))
            self.assertEqual(code, 2, out)  # argparse's usage error, before anything starts
            self.assertIn(message, out)
        self.assertFalse(self.job.pids())

    def test_a_set_among_the_extra_flags_joins_the_launchers_set(self):
        code, out = self.job.run(self.job.local_argv("--set=training.epochs=1",
                                                     "--server_arg=--set=server.data_threads=2",
                                                     "--worker_arg=--set=training.seed={index}"))
        self.assertEqual(code, 0, out)
        self.assertEqual(set_flags(self.job, "server-0"),
                         ["--set=training.epochs=1,server.data_threads=2,cluster.num_servers=1,cluster.num_workers=2"])
        self.assertEqual(set_flags(self.job, "worker-1"),
                         ["--set=training.epochs=1,training.seed=1,cluster.num_servers=1,cluster.num_workers=2"])

    def test_a_set_changing_the_counts_is_refused_before_anything_starts(self):
        code, out = self.job.run(self.job.local_argv("--worker_arg=--set=cluster.num_workers=5"))
        self.assertEqual(code, 1, out)
        self.assertIn("launch_local: --set cluster.num_workers=5: the launcher runs this job with "
                      "cluster.num_workers=2", out)
        self.assertFalse(self.job.pids())

    def test_a_worker_is_restarted_as_often_as_asked_then_fails_the_job(self):
        code, out = self.job.run(self.job.local_argv("--restart_workers=1"), FAKE_EXIT_0="wait", FAKE_EXIT_1="4", FAKE_READY=READY)
        self.assertEqual(code, 4, out)
        self.assertIn("worker 1 exited with code 4; restarting it (restart 1 of 1)", out)
        self.assertIn("worker 1 failed with exit code 4; stopping the job", out)
        self.assertFalse([p for p in self.job.pids() if alive(p)])


    def test_a_restarted_server_is_not_given_the_users_restore_again(self):
        # It restored its newest checkpoint only without it: --restore=none (or an id) given
        # again took the server back to the start at every crash (before 2026-12-05).
        code, out = self.job.run(self.job.local_argv("--restart_servers=1", "--server_arg=--restore=none",
                                                     "--server_arg=--restore", "--server_arg=7",
                                                     "--server_arg=--eval=never"),
                                 FAKE_SERVER_CRASH="9", FAKE_WORKER_AFTER="server-0.restarted")
        self.assertEqual(code, 0, out)
        self.assertIn("server 0 exited with code 9; restarting in", out)
        first = json.loads(read(os.path.join(self.job.out, "server-0.crashed")))
        self.assertEqual([a for a in first if "restore" in a or a == "7"], ["--restore=none", "--restore", "7"])
        again = json.loads(read(os.path.join(self.job.out, "server-0.argv")))
        self.assertEqual([a for a in again if "restore" in a or a == "7"], [])
        self.assertIn("--eval=never", again)
        # The same otherwise, on the port the server took at its first start.
        self.assertIn("--port=12345", again)
        self.assertEqual([a for a in again if not a.startswith("--port=")],
                         [a for a in first if "restore" not in a and a != "7" and not a.startswith("--port=")])


class LaunchSshTest(unittest.TestCase):
    def setUp(self):
        self.job = Job()

    def tearDown(self):
        self.job.cleanup()

    def test_each_worker_presents_its_own_certificate_under_mutual_tls(self):
        # As launch_local does: worker-J.pem/.key beside the config's certificate. (Every
        # worker ran with the server's certificate through ssh before 2026-12-05, and the
        # servers refused its pushes.)
        certs = os.path.join(self.job.root, "certs")
        os.makedirs(certs)
        for name in ("server.pem", "server.key", "worker-0.pem", "worker-0.key", "worker-1.pem", "worker-1.key"):
            open(os.path.join(certs, name), "w").close()
        code, out = self.job.run(self.job.ssh_argv(), FAKE_CERT=os.path.join(certs, "server.pem"))
        self.assertEqual(code, 0, out)
        for j in (0, 1):
            argv = read(os.path.join(self.job.out, "worker-%d.argv" % j))
            self.assertIn("security.cert=%s" % os.path.join(certs, "worker-%d.pem" % j), argv)
            self.assertIn("security.key=%s" % os.path.join(certs, "worker-%d.key" % j), argv)
            self.assertIn("cluster.num_workers=2", argv)  # in the same --set

    def test_a_set_among_the_extra_flags_joins_the_launchers_set(self):
        code, out = self.job.run(self.job.ssh_argv("--server_arg=--set=server.data_threads=2",
                                                   "--worker_arg=--set=training.seed={index}"))
        self.assertEqual(code, 0, out)
        self.assertEqual(set_flags(self.job, "server-0"),
                         ["--set=server.data_threads=2,cluster.num_servers=1,cluster.num_workers=2"])
        self.assertEqual(set_flags(self.job, "worker-1"),
                         ["--set=training.seed=1,cluster.num_servers=1,cluster.num_workers=2"])

    def test_a_process_whose_ssh_connection_dropped_is_stopped_on_its_host(self):
        # Its local ssh exits 255 while it runs on: the job stops, and it is signalled through
        # its pid file like the others (it was left running before 2026-12-05).
        code, out = self.job.run(self.job.ssh_argv(), FAKE_EXIT_0="wait", FAKE_EXIT_1="wait",
                                 FAKE_DROP_HOST="node-c")
        self.assertEqual(code, 255, out)
        self.assertIn("worker 1 on node-c failed with exit code 255", out)
        self.assertTrue(self.job.exists("worker-1.pid"), out)
        self.assertFalse([p for p in self.job.pids() if alive(p)], out)

    def test_a_finished_job_through_ssh_exits_0(self):
        code, out = self.job.run(self.job.ssh_argv("--worker_arg=--tag={index}"))
        self.assertEqual(code, 0, out)
        self.assertIn("servers ready at node-a:12345", out)
        self.assertIn("job finished", out)
        self.assertTrue(self.job.exists("server-0.stopped"), out)  # SIGTERM through its pid file
        hosts = read(os.path.join(self.job.out, "ssh-hosts")).split()
        self.assertEqual(set(hosts), {"node-a", "node-b", "node-c"})
        self.assertIn("--tag=1", read(os.path.join(self.job.out, "worker-1.argv")))
        # The config was copied to the remote dir through ssh.
        self.assertTrue(os.path.exists(os.path.join(self.job.root, "remote", "job.textproto")))

    def test_a_failing_worker_stops_the_job_with_its_code(self):
        code, out = self.job.run(self.job.ssh_argv(), FAKE_EXIT_0="wait", FAKE_EXIT_1="5", FAKE_READY=READY)
        self.assertEqual(code, 5, out)
        self.assertIn("worker 1 on node-c failed with exit code 5; stopping the job", out)
        self.assertTrue(self.job.exists("server-0.stopped"), out)
        self.assertTrue(self.job.exists("worker-0.stopped"), out)
        self.assertFalse([p for p in self.job.pids() if alive(p)])

    def test_sigterm_stops_every_process_on_every_host_and_exits_143(self):
        launcher = self.job.start(self.job.ssh_argv(), FAKE_EXIT_0="wait", FAKE_EXIT_1="wait")
        out = wait_for_line(launcher, "fake worker started", 2)
        launcher.send_signal(signal.SIGTERM)
        rest, _ = launcher.communicate(timeout=120)
        out += rest
        self.assertEqual(launcher.returncode, 143, out)
        for name in ("server-0", "worker-0", "worker-1"):
            self.assertTrue(self.job.exists(name + ".stopped"), out)
        self.assertFalse([p for p in self.job.pids() if alive(p)])

    def test_a_bad_hosts_file_is_named(self):
        argv = self.job.ssh_argv()
        with open(argv[2], "w") as f:
            f.write("server a port=99999\nworker b\n")
        code, out = self.job.run(argv)
        self.assertNotEqual(code, 0)
        self.assertIn("line 1: port=99999 is not a port", out)


if __name__ == "__main__":
    unittest.main()
