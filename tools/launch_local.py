#!/usr/bin/env python3
"""Runs a whole job on this machine: N ps_server and M ps_worker processes from one config.

    tools/launch_local.py configs/fashion_mnist_2x2_async.textproto
    tools/launch_local.py JOB.textproto --servers 2 --workers 4 --set training.epochs=3

Servers listen on free ports of 127.0.0.1 and keep their checkpoints under --data_root.
Every line a process prints is prefixed with its name. When every worker has finished, the
servers are stopped with SIGTERM (they write a final checkpoint). If a process fails, the
launcher names it, stops the rest and exits non-zero. Ctrl-C (or SIGTERM) stops everything;
no process is left behind, also when the launcher itself is killed (children get SIGTERM
through PR_SET_PDEATHSIG).
"""

import argparse
import ctypes
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM if the launcher dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def config_count(path, field):
    """Reads `cluster { field: N }` from a textproto (enough for the launcher's defaults)."""
    text = open(path).read()
    m = re.search(r"\b%s\s*:\s*(\d+)" % field, text)
    return int(m.group(1)) if m else None


class Proc:
    def __init__(self, name, argv, out_lock, log_dir):
        self.name = name
        self.argv = argv
        self.out_lock = out_lock
        self.log = open(os.path.join(log_dir, name.replace(" ", "_") + ".log"), "a")
        self.lines = []
        self.start()

    def start(self):
        self.popen = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent, start_new_session=True, bufsize=0)
        self.started = time.time()
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self):
        buf = b""
        while True:
            chunk = self.popen.stdout.read(4096)
            if not chunk:
                break
            buf += chunk
            # Progress displays redraw with \r; treat it as a line end.
            parts = re.split(rb"\r\n|\n|\r", buf)
            buf = parts.pop()
            for p in parts:
                self._emit(p)
        if buf:
            self._emit(buf)

    def _emit(self, raw):
        line = raw.decode("utf-8", "replace").replace("\x1b[K", "")
        if not line.strip():
            return
        self.lines.append(line)
        del self.lines[:-200]
        self.log.write(line + "\n")
        self.log.flush()
        with self.out_lock:
            sys.stdout.write("[%s] %s\n" % (self.name, line))
            sys.stdout.flush()

    def poll(self):
        return self.popen.poll()

    def signal(self, sig):
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def finish_output(self):
        self.reader.join(timeout=5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the job's JobConfig textproto")
    ap.add_argument("--servers", type=int, help="number of servers (default: cluster.num_servers)")
    ap.add_argument("--workers", type=int, help="number of workers (default: cluster.num_workers)")
    ap.add_argument("--bin_dir", default=None, help="where ps_server and ps_worker are (default: bazel-bin)")
    ap.add_argument("--data_root", default=None, help="servers' data dirs go here (default: a temp dir)")
    ap.add_argument("--log_dir", default=None, help="per-process logs (default: <data_root>/logs)")
    ap.add_argument("--set", action="append", default=[], help="config override path=value, for every process")
    ap.add_argument("--server_arg", action="append", default=[], help="extra ps_server flag")
    ap.add_argument("--worker_arg", action="append", default=[], help="extra ps_worker flag")
    ap.add_argument("--restart_servers", type=int, default=0,
                    help="restart a crashed server up to this many times (with back-off)")
    ap.add_argument("--restart_workers", type=int, default=0,
                    help="restart a failed or killed worker up to this many times; it resumes where "
                         "the servers saw it last")
    ap.add_argument("--start_timeout", type=float, default=120, help="seconds to wait for servers")
    ap.add_argument("--stop_timeout", type=float, default=60, help="seconds servers get to exit")
    args = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bin_dir = args.bin_dir or os.path.join(root, "bazel-bin")
    server_bin = os.path.join(bin_dir, "server", "ps_server")
    worker_bin = os.path.join(bin_dir, "worker", "ps_worker")
    for b in (server_bin, worker_bin):
        if not os.access(b, os.X_OK):
            sys.exit("launch_local: %s not found; build first: bazel build //server:ps_server //worker:ps_worker" % b)
    if not os.path.exists(args.config):
        sys.exit("launch_local: no config file %s" % args.config)

    num_servers = args.servers or config_count(args.config, "num_servers") or 1
    num_workers = args.workers or config_count(args.config, "num_workers") or 1
    data_root = args.data_root or tempfile.mkdtemp(prefix="ps-job-")
    log_dir = args.log_dir or os.path.join(data_root, "logs")
    os.makedirs(log_dir, exist_ok=True)
    overrides = list(args.set) + ["cluster.num_servers=%d" % num_servers,
                                  "cluster.num_workers=%d" % num_workers]
    set_flags = ["--set=" + ",".join(overrides)]
    out_lock = threading.Lock()
    procs = []
    stopping = {"flag": False}

    def say(msg):
        with out_lock:
            sys.stdout.write("[launch] %s\n" % msg)
            sys.stdout.flush()

    def stop_all(sig=signal.SIGTERM, timeout=None):
        for p in procs:
            p.signal(sig)
        deadline = time.time() + (timeout if timeout is not None else args.stop_timeout)
        for p in procs:
            if p.wait(max(0.1, deadline - time.time())) is None:
                say("%s did not stop in time: SIGKILL" % p.name)
                p.signal(signal.SIGKILL)
                p.wait(10)
        for p in procs:
            p.finish_output()

    def on_signal(signum, _frame):
        if stopping["flag"]:
            return
        stopping["flag"] = True
        say("signal %d: stopping every process" % signum)
        stop_all(signal.SIGTERM, 20)
        sys.exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    say("job %s: %d servers, %d workers; data and logs in %s" % (args.config, num_servers, num_workers, data_root))
    servers = []
    ports = []

    def server_argv(i, port):
        return [server_bin, "--config=" + args.config, "--server_index=%d" % i, "--host=127.0.0.1",
                "--port=%d" % port, "--port_file=" + os.path.join(data_root, "server-%d.port" % i),
                "--data_dir=" + os.path.join(data_root, "server-%d" % i)] + set_flags + args.server_arg

    for i in range(num_servers):
        port_file = os.path.join(data_root, "server-%d.port" % i)
        if os.path.exists(port_file):
            os.remove(port_file)
        p = Proc("server %d" % i, server_argv(i, 0), out_lock, log_dir)
        procs.append(p)
        servers.append(p)
    deadline = time.time() + args.start_timeout
    for i, p in enumerate(servers):
        port_file = os.path.join(data_root, "server-%d.port" % i)
        while not os.path.exists(port_file):
            if p.poll() is not None:
                say("server %d exited with code %s while starting" % (i, p.poll()))
                stop_all()
                return 1
            if time.time() > deadline:
                say("server %d did not start within %.0f s" % (i, args.start_timeout))
                stop_all()
                return 1
            time.sleep(0.05)
        ports.append(int(open(port_file).read().strip()))
    addresses = ",".join("127.0.0.1:%d" % port for port in ports)
    say("servers ready at %s" % addresses)

    workers = []
    for j in range(num_workers):
        argv = [worker_bin, "--config=" + args.config, "--worker_index=%d" % j,
                "--servers=" + addresses] + set_flags + args.worker_arg
        p = Proc("worker %d" % j, argv, out_lock, log_dir)
        procs.append(p)
        workers.append(p)

    restarts = [0] * num_servers
    worker_restarts = [0] * num_workers
    failed = None
    while failed is None:
        if all(w.poll() == 0 for w in workers):
            break
        for j, w in enumerate(workers):
            code = w.poll()
            if code is None or code == 0:
                continue
            if worker_restarts[j] < args.restart_workers:
                worker_restarts[j] += 1
                say("worker %d exited with code %d; restarting it (restart %d of %d)" %
                    (j, code, worker_restarts[j], args.restart_workers))
                w.start()
            else:
                failed = "worker %d failed with exit code %d" % (j, code)
        for i, s in enumerate(servers):
            code = s.poll()
            if code is None or code == 0:
                continue  # 0: it saw every worker finish and shut down by itself
            if restarts[i] < args.restart_servers:
                restarts[i] += 1
                backoff = min(10.0, 0.5 * 2 ** (restarts[i] - 1))
                say("server %d exited with code %s; restarting in %.1f s (restart %d of %d)" %
                    (i, code, backoff, restarts[i], args.restart_servers))
                time.sleep(backoff)
                # Same port: the workers keep their addresses.
                s.argv = server_argv(i, ports[i])
                s.start()
            else:
                failed = "server %d exited with code %s before the workers finished" % (i, code)
        time.sleep(0.1)

    if failed:
        say(failed + "; stopping the job")
        stop_all()
        return 1
    say("all %d workers finished; stopping the servers" % num_workers)
    for s in servers:
        s.signal(signal.SIGTERM)
    bad = []
    for i, s in enumerate(servers):
        code = s.wait(args.stop_timeout)
        if code is None:
            s.signal(signal.SIGKILL)
            s.wait(10)
            bad.append("server %d did not stop within %.0f s" % (i, args.stop_timeout))
        elif code != 0:
            bad.append("server %d exited with code %d" % (i, code))
        s.finish_output()
    for w in workers:
        w.finish_output()
    if bad:
        say("; ".join(bad))
        return 1
    say("job finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
