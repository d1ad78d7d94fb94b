#!/usr/bin/env python3
"""Runs a whole job on this machine: N ps_server and M ps_worker processes from one config.

    tools/launch_local.py configs/fashion_mnist_2x2_async.textproto
    tools/launch_local.py JOB.textproto --servers 2 --workers 4 --set training.epochs=3

Servers listen on free ports of 127.0.0.1 and keep their checkpoints under --data_root.
Every line a process prints is prefixed with its name. When every worker has finished, the
servers are stopped with SIGTERM (they write a final checkpoint). If a process fails, the
launcher names it, stops the rest and exits with that process's code (128 + N for signal N). Ctrl-C (or SIGTERM) stops everything (exit 130, or 143 for SIGTERM);
no process is left behind, also when the launcher itself is killed (children get SIGTERM
through PR_SET_PDEATHSIG).
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

from launch_common import (Proc, StopRequest, Stopped, cluster_size, drop_restore, effective_config, exit_status,
                           merge_sets, worker_args, worker_certificates)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the job's JobConfig textproto")
    ap.add_argument("--servers", type=int, help="number of servers (default: cluster.num_servers)")
    ap.add_argument("--workers", type=int, help="number of workers (default: cluster.num_workers)")
    ap.add_argument("--bin_dir", default=None, help="where ps_server and ps_worker are (default: bazel-bin)")
    ap.add_argument("--data_root", default=None, help="servers' data dirs go here (default: a temp dir)")
    ap.add_argument("--log_dir", default=None, help="per-process logs (default: <data_root>/logs)")
    ap.add_argument("--set", action="append", default=[], help="config override path=value, for every process")
    ap.add_argument("--server_arg", action="append", default=[],
                    help="extra ps_server flag; a --set here joins the launcher's one --set")
    ap.add_argument("--worker_arg", action="append", default=[],
                    help="extra ps_worker flag; {index} becomes the worker's index "
                         "(e.g. --worker_arg=--log_path=/tmp/w{index}.jsonl); a --set joins the launcher's")
    ap.add_argument("--restart_servers", type=int, default=0,
                    help="restart a crashed server up to this many times (with back-off)")
    ap.add_argument("--restart_workers", type=int, default=0,
                    help="restart a failed or killed worker up to this many times; it resumes where "
                         "the servers saw it last")
    ap.add_argument("--start_timeout", type=float, default=120, help="seconds to wait for servers")
    ap.add_argument("--stop_timeout", type=float, default=60, help="seconds servers get to exit")
    ap.add_argument("--metrics", action="store_true",
                    help="give every process a Prometheus /metrics endpoint on a free port of "
                         "127.0.0.1, print where each is, and keep <data_root>/metrics_targets.json "
                         "(Prometheus file_sd format) up to date")
    args = ap.parse_args(argv)
    for name in ("servers", "workers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error("--%s must be at least 1" % name)
    for name in ("restart_servers", "restart_workers"):
        if getattr(args, name) < 0:
            ap.error("--%s must not be negative" % name)
    for name in ("start_timeout", "stop_timeout"):
        if not getattr(args, name) > 0:
            ap.error("--%s must be positive" % name)
    return args


class LocalJob:
    """The processes of one job on this machine and the loop that watches them.

    Signals only set the StopRequest flag; the loops call stop.check(), which raises Stopped."""

    def __init__(self, args, bin_dir, cfg):
        self.args = args
        self.server_bin = os.path.join(bin_dir, "server", "ps_server")
        self.worker_bin = os.path.join(bin_dir, "worker", "ps_worker")
        cfg_servers, cfg_workers = cluster_size(cfg)
        self.num_servers = args.servers or cfg_servers
        self.num_workers = args.workers or cfg_workers
        overrides = list(args.set)
        if args.metrics:
            overrides.append("metrics.host=127.0.0.1")
        counts = ["cluster.num_servers=%d" % self.num_servers, "cluster.num_workers=%d" % self.num_workers]
        # Each process's one --set flag and its other extra flags; ValueError before anything
        # starts where a --server_arg/--worker_arg --set changes the counts.
        self.server_flags = merge_sets(overrides, args.server_arg, counts)
        identities = worker_certificates(cfg, self.num_workers)
        self.worker_flags = [merge_sets(overrides + identities[j], worker_args(args.worker_arg, j), counts)
                             for j in range(self.num_workers)]
        self.data_root = args.data_root or tempfile.mkdtemp(prefix="ps-job-")
        self.log_dir = args.log_dir or os.path.join(self.data_root, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.out_lock = threading.Lock()
        self.procs, self.servers, self.workers, self.ports = [], [], [], []
        # Metrics endpoints: name -> (port file, role, index); ports seen so far.
        self.metrics_files, self.metrics_ports = {}, {}
        self.stop = None  # the StopRequest, set by main before run()

    def say(self, msg):
        with self.out_lock:
            sys.stdout.write("[launch] %s\n" % msg)
            sys.stdout.flush()

    def stop_all(self, sig=signal.SIGTERM, timeout=None):
        """sig to every process, SIGKILL to those still running after timeout; all reaped."""
        for p in self.procs:
            p.signal(sig)
        deadline = time.time() + (timeout if timeout is not None else self.args.stop_timeout)
        for p in self.procs:
            if p.wait(max(0.1, deadline - time.time())) is None:
                self.say("%s did not stop in time: SIGKILL" % p.name)
                p.signal(signal.SIGKILL)
                p.wait(10)
        for p in self.procs:
            p.finish_output()

    def metrics_flags(self, role, index):
        if not self.args.metrics:
            return []
        path = os.path.join(self.data_root, "%s-%d.metrics_port" % (role, index))
        if os.path.exists(path):
            os.remove(path)
        self.metrics_files["%s %d" % (role, index)] = (path, role, index)
        return ["--metrics_port=0", "--metrics_port_file=" + path]

    def report_metrics(self):
        """Prints endpoints that appeared or moved (restarts) and rewrites the file_sd targets."""
        changed = False
        for name, (path, role, index) in sorted(self.metrics_files.items()):
            try:
                port = int(open(path).read().strip())
            except (OSError, ValueError):
                continue
            if self.metrics_ports.get(name) != port:
                self.metrics_ports[name] = port
                changed = True
                self.say("metrics of %s: http://127.0.0.1:%d/metrics" % (name, port))
        if changed:
            targets = [{"targets": ["127.0.0.1:%d" % self.metrics_ports[name]],
                        "labels": {"role": role, "index": str(index)}}
                       for name, (_, role, index) in sorted(self.metrics_files.items())
                       if name in self.metrics_ports]
            tmp = os.path.join(self.data_root, "metrics_targets.json.tmp")
            with open(tmp, "w") as f:
                json.dump(targets, f, indent=1)
            os.replace(tmp, os.path.join(self.data_root, "metrics_targets.json"))

    def port_file(self, i):
        return os.path.join(self.data_root, "server-%d.port" % i)

    def server_argv(self, i, port, restart=False):
        """Server i's command line; a restart's drops the user's --restore: that chose where
        the job starts, and given again it would take the server back there, dropping what was
        trained since (`none`: to the initial values)."""
        rest = drop_restore(self.server_flags[1]) if restart else self.server_flags[1]
        return [self.server_bin, "--config=" + self.args.config, "--server_index=%d" % i, "--cluster_from=flags",
                "--host=127.0.0.1", "--port=%d" % port, "--port_file=" + self.port_file(i),
                "--data_dir=" + os.path.join(self.data_root, "server-%d" % i)] + self.server_flags[0] + \
            self.metrics_flags("server", i) + rest

    def start_servers(self):
        """Starts the servers and waits for their port files; False (after stopping everything)
        if one exits or does not start in time."""
        for i in range(self.num_servers):
            if os.path.exists(self.port_file(i)):
                os.remove(self.port_file(i))
            p = Proc("server %d" % i, self.server_argv(i, 0), self.out_lock, self.log_dir)
            self.procs.append(p)
            self.servers.append(p)
        deadline = time.time() + self.args.start_timeout
        for i, p in enumerate(self.servers):
            while not os.path.exists(self.port_file(i)):
                problem = None
                if p.poll() is not None:
                    problem = "server %d exited with code %s while starting" % (i, p.poll())
                elif time.time() > deadline:
                    problem = "server %d did not start within %.0f s" % (i, self.args.start_timeout)
                if problem:
                    self.say(problem)
                    self.stop_all()
                    return False
                self.stop.check()
                time.sleep(0.05)
            self.ports.append(int(open(self.port_file(i)).read().strip()))
        return True

    def start_workers(self, addresses):
        for j in range(self.num_workers):
            argv = [self.worker_bin, "--config=" + self.args.config, "--worker_index=%d" % j,
                    "--cluster_from=flags", "--servers=" + addresses] + self.worker_flags[j][0] + \
                self.metrics_flags("worker", j) + self.worker_flags[j][1]
            p = Proc("worker %d" % j, argv, self.out_lock, self.log_dir)
            self.procs.append(p)
            self.workers.append(p)

    def watch(self):
        """Until every worker has finished (returns None) or a process failed beyond its
        restarts (returns (message, exit status))."""
        restarts = [0] * self.num_servers
        worker_restarts = [0] * self.num_workers
        while True:
            self.stop.check()
            self.report_metrics()
            if all(w.poll() == 0 for w in self.workers):
                return None
            for j, w in enumerate(self.workers):
                code = w.poll()
                if code is None or code == 0:
                    continue
                if worker_restarts[j] >= self.args.restart_workers:
                    return "worker %d failed with exit code %d" % (j, code), exit_status(code)
                worker_restarts[j] += 1
                self.say("worker %d exited with code %d; restarting it (restart %d of %d)" %
                         (j, code, worker_restarts[j], self.args.restart_workers))
                w.start()
            for i, s in enumerate(self.servers):
                code = s.poll()
                if code is None or code == 0:
                    continue  # 0: it saw every worker finish and shut down by itself
                if restarts[i] >= self.args.restart_servers:
                    return ("server %d exited with code %s before the workers finished" % (i, code),
                            exit_status(code))
                restarts[i] += 1
                backoff = min(10.0, 0.5 * 2 ** (restarts[i] - 1))
                self.say("server %d exited with code %s; restarting in %.1f s (restart %d of %d)" %
                         (i, code, backoff, restarts[i], self.args.restart_servers))
                time.sleep(backoff)
                # Same port: the workers keep their addresses. Its newest checkpoint, whatever
                # --restore chose at the start.
                s.argv = self.server_argv(i, self.ports[i], restart=True)
                s.start()
            time.sleep(0.1)

    def stop_servers(self):
        """After the workers finished: SIGTERM to the servers (a final checkpoint); 0 if each
        exits 0 in time."""
        self.say("all %d workers finished; stopping the servers" % self.num_workers)
        for s in self.servers:
            s.signal(signal.SIGTERM)
        bad = []
        for i, s in enumerate(self.servers):
            code = s.wait(self.args.stop_timeout)
            if code is None:
                s.signal(signal.SIGKILL)
                s.wait(10)
                bad.append("server %d did not stop within %.0f s" % (i, self.args.stop_timeout))
            elif code != 0:
                bad.append("server %d exited with code %d" % (i, code))
            s.finish_output()
        for w in self.workers:
            w.finish_output()
        if bad:
            self.say("; ".join(bad))
            return 1
        self.say("job finished")
        return 0

    def run(self):
        """Starts the servers, then the workers, and watches them until the job ends; returns
        the exit status. Raises Stopped (from stop.check()) once SIGINT or SIGTERM arrived."""
        self.say("job %s: %d servers, %d workers; data and logs in %s" %
                 (self.args.config, self.num_servers, self.num_workers, self.data_root))
        if not self.start_servers():
            return 1
        addresses = ",".join("127.0.0.1:%d" % port for port in self.ports)
        self.say("servers ready at %s" % addresses)
        self.start_workers(addresses)
        failed = self.watch()
        if failed:
            self.say(failed[0] + "; stopping the job")
            self.stop_all()
            return failed[1]
        return self.stop_servers()


def main():
    args = parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bin_dir = args.bin_dir or os.path.join(root, "bazel-bin")
    for b in (os.path.join(bin_dir, "server", "ps_server"), os.path.join(bin_dir, "worker", "ps_worker")):
        if not os.access(b, os.X_OK):
            sys.exit("launch_local: %s not found; build first: bazel build //server:ps_server //worker:ps_worker" % b)
    if not os.path.exists(args.config):
        sys.exit("launch_local: no config file %s" % args.config)
    # The job's counts as the binaries read them: the file with --set applied.
    try:
        cfg = effective_config(bin_dir, args.config, args.set)
    except RuntimeError as e:
        sys.exit("launch_local: %s: %s" % (args.config, e))
    try:
        job = LocalJob(args, bin_dir, cfg)
    except ValueError as e:
        sys.exit("launch_local: %s" % e)
    # The handlers only set a flag (see StopRequest); the job's loops act on it.
    job.stop = StopRequest()
    try:
        return job.run()
    except Stopped as e:
        job.say("signal %d: stopping every process" % e.signum)
        job.stop_all(signal.SIGTERM, 20)
        return 128 + e.signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports


if __name__ == "__main__":
    sys.exit(main())
