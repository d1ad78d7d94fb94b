#!/usr/bin/env python3
"""Runs a whole job on this machine: N ps_server and M ps_worker processes from one config.

    tools/launch_local.py configs/fashion_mnist_2x2_async.textproto
    tools/launch_local.py JOB.textproto --servers 2 --workers 4 --set training.epochs=3

Servers listen on free ports of 127.0.0.1 and keep their checkpoints under --data_root.
Every line a process prints is prefixed with its name. When every worker has finished, the
servers are stopped with SIGTERM (they write a final checkpoint). If a process fails, the
launcher names it, stops the rest and exits with that process's code (128 + N for signal N). Ctrl-C (or SIGTERM) stops everything;
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

from launch_common import (Proc, StopRequest, Stopped, cluster_size, effective_config, exit_status, worker_args,
                           worker_certificates)


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
    ap.add_argument("--worker_arg", action="append", default=[], help="extra ps_worker flag; {index} becomes the worker's index "
                         "(e.g. --worker_arg=--log_path=/tmp/w{index}.jsonl)")
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

    # The job's counts as the binaries read them: the file with --set applied.
    try:
        cfg = effective_config(bin_dir, args.config, args.set)
    except RuntimeError as e:
        sys.exit("launch_local: %s: %s" % (args.config, e))
    cfg_servers, cfg_workers = cluster_size(cfg)
    num_servers = args.servers or cfg_servers
    num_workers = args.workers or cfg_workers
    data_root = args.data_root or tempfile.mkdtemp(prefix="ps-job-")
    log_dir = args.log_dir or os.path.join(data_root, "logs")
    os.makedirs(log_dir, exist_ok=True)
    overrides = list(args.set) + ["cluster.num_servers=%d" % num_servers,
                                  "cluster.num_workers=%d" % num_workers]
    if args.metrics:
        overrides.append("metrics.host=127.0.0.1")
    set_flags = ["--set=" + ",".join(overrides)]
    worker_identities = worker_certificates(cfg, num_workers)
    out_lock = threading.Lock()
    procs = []

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

    def run_job():
        """Starts the servers, then the workers, and watches them until the job ends.

        Raises Stopped (from stop.check()) once SIGINT or SIGTERM arrived."""

        say("job %s: %d servers, %d workers; data and logs in %s" % (args.config, num_servers, num_workers, data_root))
        servers = []
        ports = []

        # Metrics endpoints: name -> (port file, role, index); ports seen so far.
        metrics_files = {}
        metrics_ports = {}

        def metrics_flags(role, index):
            if not args.metrics:
                return []
            path = os.path.join(data_root, "%s-%d.metrics_port" % (role, index))
            if os.path.exists(path):
                os.remove(path)
            metrics_files["%s %d" % (role, index)] = (path, role, index)
            return ["--metrics_port=0", "--metrics_port_file=" + path]

        def report_metrics():
            """Prints endpoints that appeared or moved (restarts) and rewrites the file_sd targets."""
            changed = False
            for name, (path, role, index) in sorted(metrics_files.items()):
                try:
                    port = int(open(path).read().strip())
                except (OSError, ValueError):
                    continue
                if metrics_ports.get(name) != port:
                    metrics_ports[name] = port
                    changed = True
                    say("metrics of %s: http://127.0.0.1:%d/metrics" % (name, port))
            if changed:
                targets = [{"targets": ["127.0.0.1:%d" % metrics_ports[name]],
                            "labels": {"role": role, "index": str(index)}}
                           for name, (_, role, index) in sorted(metrics_files.items())
                           if name in metrics_ports]
                tmp = os.path.join(data_root, "metrics_targets.json.tmp")
                with open(tmp, "w") as f:
                    json.dump(targets, f, indent=1)
                os.replace(tmp, os.path.join(data_root, "metrics_targets.json"))

        def server_argv(i, port):
            return [server_bin, "--config=" + args.config, "--server_index=%d" % i, "--cluster_from=flags",
                    "--host=127.0.0.1",
                    "--port=%d" % port, "--port_file=" + os.path.join(data_root, "server-%d.port" % i),
                    "--data_dir=" + os.path.join(data_root, "server-%d" % i)] + set_flags + \
                metrics_flags("server", i) + args.server_arg

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
                stop.check()
                time.sleep(0.05)
            ports.append(int(open(port_file).read().strip()))
        addresses = ",".join("127.0.0.1:%d" % port for port in ports)
        say("servers ready at %s" % addresses)

        workers = []
        for j in range(num_workers):
            argv = [worker_bin, "--config=" + args.config, "--worker_index=%d" % j,
                    "--cluster_from=flags", "--servers=" + addresses] + \
                ["--set=" + ",".join(overrides + worker_identities[j])] + metrics_flags("worker", j) + \
                worker_args(args.worker_arg, j)
            p = Proc("worker %d" % j, argv, out_lock, log_dir)
            procs.append(p)
            workers.append(p)

        restarts = [0] * num_servers
        worker_restarts = [0] * num_workers
        failed, failed_code = None, 1
        while failed is None:
            stop.check()
            report_metrics()
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
                    failed, failed_code = "worker %d failed with exit code %d" % (j, code), exit_status(code)
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
                    failed_code = exit_status(code)
            time.sleep(0.1)

        if failed:
            say(failed + "; stopping the job")
            stop_all()
            return failed_code
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

    # The handlers only set a flag (see StopRequest); run_job's loops act on it.
    stop = StopRequest()
    try:
        return run_job()
    except Stopped as e:
        say("signal %d: stopping every process" % e.signum)
        stop_all(signal.SIGTERM, 20)
        return 130


if __name__ == "__main__":
    sys.exit(main())
