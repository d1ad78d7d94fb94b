#!/usr/bin/env python3
"""Runs a job on several hosts: ps_server and ps_worker processes as a hosts file says.

    tools/launch_ssh.py HOSTS JOB.textproto [--set training.epochs=3]
    tools/launch_ssh.py HOSTS JOB.textproto --exec "ip netns exec {host}"

The hosts file has one process per line, ROLE HOST [key=value ...]; `#` starts a comment:

    # role  host    options
    server  node-a  addr=10.0.0.1 port=7000 data_dir=/var/lib/ps/0
    server  node-b  addr=10.0.0.2
    worker  node-c
    worker  node-d  bin_dir=/opt/ps

Servers take indices 0, 1, ... and workers 0, 1, ... in the order of their lines; a host may
appear on several lines. Options (all optional):
    addr=A      address workers and psctl use to reach this server (default: HOST)
    port=P      the server's port (default: --port); 0 = any free one, read from its output
    data_dir=D  the server's RocksDB checkpoint directory (default: DIR/server-I)
    dir=D       working directory on the host: config copy, pid files (default: --remote_dir)
    bin_dir=D   where server/ps_server and worker/ps_worker are on the host (default: --bin_dir)

Each process is started with the --exec command, `{host}` replaced by HOST: by default
`ssh -o BatchMode=yes {host}`; `ip netns exec {host}` runs the job in network namespaces of this
machine. For ssh, which hands its arguments to the remote shell as one line, the remote command
is passed shell-quoted (--exec_quote forces that for other ssh-like commands); other exec
commands get it as separate arguments. The config is first copied to DIR/job.textproto on every
host through the same command (--no_copy_config: use the config's path as it is); the files it
names (data, certificates) and the binaries must already be on the hosts, at those paths.

The launcher waits until every server prints that it listens, then starts the workers with the
servers' addresses. Every output line is prefixed with the process's name and host, and kept in
--log_dir. When all workers have finished, the servers get SIGTERM (a final checkpoint, then
exit 0). At the end it prints every process's exit code; if any process failed, it stops the
others and exits with the failed process's code (128 + N for signal N). Ctrl-C or SIGTERM stops every process on every host (exit 130, or 143 for SIGTERM).
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

from launch_common import (Proc, StopRequest, Stopped, die_with_parent, effective_config, exit_status,
                           merge_sets, worker_args, worker_certificates)

ROLES = ("server", "worker")
OPTIONS = ("addr", "port", "data_dir", "dir", "bin_dir")


class HostsError(ValueError):
    pass


def parse_hosts(text, default_port, default_dir, default_bin_dir):
    """Hosts file -> (servers, workers): lists of dicts with role, index, host and options."""
    entries = {"server": [], "worker": []}
    for lineno, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) < 2 or words[0] not in ROLES:
            raise HostsError("line %d: expected 'server HOST [key=value ...]' or 'worker HOST ...', "
                             "got %r" % (lineno, raw.strip()))
        role, host = words[0], words[1]
        e = {"role": role, "index": len(entries[role]), "host": host, "addr": host,
             "port": default_port, "dir": default_dir, "bin_dir": default_bin_dir}
        for opt in words[2:]:
            key, eq, value = opt.partition("=")
            if not eq or key not in OPTIONS or not value:
                raise HostsError("line %d: bad option %r (known: %s)" % (lineno, opt, ", ".join(OPTIONS)))
            if role == "worker" and key in ("port", "data_dir"):
                raise HostsError("line %d: %s= is for servers" % (lineno, key))
            if key == "port":
                if not value.isdigit() or int(value) > 65535:
                    raise HostsError("line %d: port=%s is not a port" % (lineno, value))
                value = int(value)
            e[key] = value
        entries[role].append(e)
    for e in entries["server"]:
        e.setdefault("data_dir", "%s/server-%d" % (e["dir"], e["index"]))
    if not entries["server"] or not entries["worker"]:
        raise HostsError("need at least one server line and one worker line")
    return entries["server"], entries["worker"]


def exec_argv(template, host, script, quote):
    """The local argv that runs `sh -c script` on host through the exec command."""
    prefix = [w.replace("{host}", host) for w in shlex.split(template)]
    if quote is None:
        quote = bool(prefix) and os.path.basename(prefix[0]) == "ssh"
    if quote:
        return prefix + ["sh -c " + shlex.quote(script)]
    return prefix + ["sh", "-c", script]


class Launcher:
    def __init__(self, args, servers, workers):
        self.args = args
        self.servers = servers
        self.workers = workers
        self.out_lock = threading.Lock()
        self.procs = []  # (entry, Proc)
        # Server index -> the port it listens on; written by the reader threads.
        self.ready = {}
        # SIGINT/SIGTERM only set this flag (see StopRequest); the loops call check().
        self.stop_request = None

    def say(self, msg):
        with self.out_lock:
            sys.stdout.write("[launch] %s\n" % msg)
            sys.stdout.flush()

    def argv(self, e, script):
        return exec_argv(self.args.exec_template, e["host"], script, self.args.exec_quote)

    def run_on(self, e, script, stdin=b"", timeout=60):
        """Runs a short command on e's host; returns (exit code, output)."""
        try:
            p = subprocess.run(self.argv(e, script), input=stdin, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout, preexec_fn=die_with_parent)
        except subprocess.TimeoutExpired:
            return None, "timed out after %d s" % timeout
        return p.returncode, p.stdout.decode("utf-8", "replace").strip()

    def config_path(self, e):
        return self.args.config if self.args.no_copy_config else e["dir"] + "/job.textproto"

    def copy_config(self):
        data = open(self.args.config, "rb").read()
        done = set()
        for e in self.servers + self.workers:
            key = (e["host"], e["dir"])
            if key in done:
                continue
            done.add(key)
            # Through a temporary name, so that processes sharing a file system never read half a file.
            d = shlex.quote(e["dir"])
            script = ("mkdir -p %s && cat > %s/.job.textproto.$$ && mv -f %s/.job.textproto.$$ %s/job.textproto"
                      % (d, d, d, d))
            code, out = self.run_on(e, script, stdin=data)
            if code != 0:
                raise RuntimeError("copying the config to %s:%s failed (exit %s): %s" %
                                   (e["host"], e["dir"], code, out))

    def name(self, e):
        return "%s %d" % (e["role"], e["index"])

    def pid_file(self, e):
        return "%s/%s-%d.pid" % (e["dir"], e["role"], e["index"])

    def binary(self, e):
        return "%s/%s/ps_%s" % (e["bin_dir"], e["role"], e["role"])

    def start(self, e, flags):
        argv = [self.binary(e), "--config=" + self.config_path(e)] + flags
        # `exec` keeps the shell's pid, so the pid file names the binary itself.
        script = "mkdir -p %s && echo $$ > %s && exec %s" % (
            shlex.quote(e["dir"]), shlex.quote(self.pid_file(e)), " ".join(shlex.quote(a) for a in argv))
        on_line = None
        if e["role"] == "server":
            on_line = lambda line, e=e: self.server_line(e, line)
        p = Proc(self.name(e), self.argv(e, script), self.out_lock, self.args.log_dir,
                 prefix="%s@%s" % (self.name(e), e["host"]), on_line=on_line)
        self.procs.append((e, p))
        return p

    def server_line(self, e, line):
        marker = "ps_server %d listening on " % e["index"]
        if line.startswith(marker):
            self.ready[e["index"]] = int(line[len(marker):].rsplit(":", 1)[1])

    def signal_remote(self, e, sig):
        """Sends sig to e's process on its host (by its pid file, if the pid is still ps_<role>);
        True if that process was there (with sig 0: whether it still runs)."""
        f = shlex.quote(self.pid_file(e))
        script = ('p=$(cat %s 2>/dev/null) && [ -n "$p" ] && grep -qa ps_%s /proc/$p/cmdline 2>/dev/null'
                  ' && kill -s %s "$p"' % (f, e["role"], sig))
        code, _ = self.run_on(e, script, timeout=30)
        return code == 0

    def stop(self, procs, timeout):
        """SIGTERM on the hosts, then SIGKILL after timeout; the local exec commands last. Every
        process is signalled on its host, also one whose local exec command already ended (a
        dropped ssh connection says nothing of the process it started)."""
        live = [(e, p) for e, p in procs if p.poll() is None]
        detached = [e for e, p in procs if p.poll() is not None]
        threads = [threading.Thread(target=self.signal_remote, args=(e, "TERM")) for e, _ in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.time() + timeout
        for e, p in live:
            if p.wait(max(0.1, deadline - time.time())) is None:
                self.say("%s on %s did not stop within %.0f s: SIGKILL" % (self.name(e), e["host"], timeout))
                self.signal_remote(e, "KILL")
                p.signal(signal.SIGKILL)
                p.wait(10)
        for e in detached:
            while self.signal_remote(e, "0") and time.time() < deadline:
                time.sleep(0.5)
            if self.signal_remote(e, "0"):
                self.say("%s on %s did not stop within %.0f s: SIGKILL" % (self.name(e), e["host"], timeout))
                self.signal_remote(e, "KILL")
        for _, p in procs:
            p.finish_output()

    def wait_for_servers(self, server_procs):
        deadline = time.time() + self.args.start_timeout
        while len(self.ready) < len(self.servers):
            for e, p in server_procs:
                if p.poll() is not None and e["index"] not in self.ready:
                    raise RuntimeError("server %d on %s exited with code %s while starting" %
                                       (e["index"], e["host"], p.poll()))
            if time.time() > deadline:
                missing = [str(e["index"]) for e in self.servers if e["index"] not in self.ready]
                raise RuntimeError("servers %s did not start within %.0f s" %
                                   (",".join(missing), self.args.start_timeout))
            self.check_stop()
            time.sleep(0.1)

    def check_stop(self):
        if self.stop_request is not None:
            self.stop_request.check()

    def run(self):
        args = self.args
        counts = ["cluster.num_servers=%d" % len(self.servers), "cluster.num_workers=%d" % len(self.workers)]
        overrides = list(args.set) + counts
        # Under mutual TLS each worker presents its own certificate (worker-J.pem/.key beside
        # the config's, as make_certs.sh writes them: the same directory on every host), or
        # the servers refuse its pushes; read from the config as the binaries see it.
        try:
            cfg = effective_config(args.bin_dir, args.config, overrides)
        except (OSError, RuntimeError, ValueError) as e:
            self.say("warning: cannot read the config here (%s); every worker uses its certificate" % e)
            cfg = {}
        identities = worker_certificates(cfg, 1 + max([e["index"] for e in self.workers], default=-1))
        # Each process's one --set flag and its other extra flags; ValueError before anything
        # starts where a --server_arg/--worker_arg --set changes the counts.
        server_set, server_rest = merge_sets(args.set, args.server_arg, counts)
        worker_flags = {e["index"]: merge_sets(list(args.set) + identities[e["index"]],
                                               worker_args(args.worker_arg, e["index"]), counts)
                        for e in self.workers}
        self.say("job %s: %d servers, %d workers through '%s'; logs in %s" %
                 (args.config, len(self.servers), len(self.workers), args.exec_template, args.log_dir))
        if len({e["host"] for e in self.servers + self.workers}) > 1:
            for e in self.servers:
                if e["addr"] == "localhost" or e["addr"].startswith("127."):
                    self.say("warning: server %d's address %s is loopback; workers on other hosts cannot "
                             "reach it (set addr= in the hosts file)" % (e["index"], e["addr"]))
        if not args.no_copy_config:
            self.copy_config()
        server_procs = []
        for e in self.servers:
            flags = ["--server_index=%d" % e["index"], "--cluster_from=flags", "--port=%d" % e["port"],
                     "--data_dir=" + e["data_dir"]] + server_set + server_rest
            server_procs.append((e, self.start(e, flags)))
        self.wait_for_servers(server_procs)
        addresses = ",".join("%s:%d" % (e["addr"], self.ready[e["index"]]) for e in self.servers)
        self.say("servers ready at %s" % addresses)
        worker_procs = []
        for e in self.workers:
            set_flag, rest = worker_flags[e["index"]]
            flags = ["--worker_index=%d" % e["index"], "--cluster_from=flags", "--servers=" + addresses] + \
                set_flag + rest
            worker_procs.append((e, self.start(e, flags)))

        failed, failed_code = None, None
        while failed is None and not all(p.poll() == 0 for _, p in worker_procs):
            for e, p in worker_procs:
                if p.poll() not in (None, 0):
                    failed = "worker %d on %s failed with exit code %d" % (e["index"], e["host"], p.poll())
                    failed_code = exit_status(p.poll())
            for e, p in server_procs:
                # 0: it saw every worker finish and shut down by itself.
                if p.poll() not in (None, 0):
                    failed = "server %d on %s exited with code %d before the workers finished" % (
                        e["index"], e["host"], p.poll())
                    failed_code = exit_status(p.poll())
            self.check_stop()
            time.sleep(0.2)
        if failed:
            self.say(failed + "; stopping the job")
            self.stop(self.procs, args.stop_timeout)
        else:
            self.say("all %d workers finished; stopping the servers" % len(self.workers))
            self.stop(server_procs, args.stop_timeout)
            for _, p in worker_procs:
                p.finish_output()
        return self.report(failed_code)

    def report(self, failed_code=None):
        """Prints every process's exit code; returns failed_code (the first failure's), else 1
        if any process ended badly, else 0."""
        bad = 0
        self.say("exit codes:")
        for e, p in self.procs:
            code = p.poll()
            bad += code != 0
            self.say("  %-10s %-20s %s" % (self.name(e), e["host"], "running" if code is None else code))
        self.say("job failed" if bad or failed_code else "job finished")
        return failed_code or (1 if bad else 0)

    def abort(self, signum):
        """After SIGINT/SIGTERM, from the main loop (never from the handler)."""
        self.say("signal %d: stopping every process" % signum)
        self.stop(self.procs, 20)
        return 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hosts", help="hosts file (format above)")
    ap.add_argument("config", help="the job's JobConfig textproto")
    ap.add_argument("--exec", dest="exec_template", default="ssh -o BatchMode=yes {host}",
                    help="command that runs a command on {host} (default: %(default)s)")
    ap.add_argument("--exec_quote", action="store_const", const=True, default=None,
                    help="pass the remote command as one shell-quoted word, as ssh needs "
                         "(default: only when the exec command is ssh)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--bin_dir", default=os.path.realpath(os.path.join(root, "bazel-bin")),
                    help="where server/ps_server and worker/ps_worker are on the hosts "
                         "(default: this checkout's bazel-bin, resolved)")
    ap.add_argument("--remote_dir", default=None,
                    help="working directory on the hosts (default: /tmp/ps-job-<time>-<pid>, new)")
    ap.add_argument("--port", type=int, default=7000, help="servers' port unless the hosts file sets one")
    ap.add_argument("--no_copy_config", action="store_true",
                    help="do not copy the config; every host reads it at its path here")
    ap.add_argument("--log_dir", default=None, help="per-process logs here (default: a temp dir)")
    ap.add_argument("--set", action="append", default=[], help="config override path=value, for every process")
    ap.add_argument("--server_arg", action="append", default=[],
                    help="extra ps_server flag; a --set here joins the launcher's one --set")
    ap.add_argument("--worker_arg", action="append", default=[],
                    help="extra ps_worker flag; {index} becomes the worker's index; a --set joins the launcher's")
    ap.add_argument("--start_timeout", type=float, default=120, help="seconds to wait for servers")
    ap.add_argument("--stop_timeout", type=float, default=60, help="seconds servers get to exit")
    args = ap.parse_args()

    if not os.path.exists(args.config):
        sys.exit("launch_ssh: no config file %s" % args.config)
    args.config = os.path.abspath(args.config)
    args.remote_dir = args.remote_dir or "/tmp/ps-job-%s-%d" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid())
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="ps-ssh-logs-")
    os.makedirs(args.log_dir, exist_ok=True)
    try:
        servers, workers = parse_hosts(open(args.hosts).read(), args.port, args.remote_dir, args.bin_dir)
    except (OSError, HostsError) as e:
        sys.exit("launch_ssh: %s: %s" % (args.hosts, e))

    launcher = Launcher(args, servers, workers)
    launcher.stop_request = StopRequest()
    try:
        return launcher.run()
    except Stopped as e:
        return launcher.abort(e.signum)
    except (RuntimeError, ValueError) as e:
        launcher.say("%s; stopping the job" % e)
        launcher.stop(launcher.procs, args.stop_timeout)
        launcher.report()
        return 1


if __name__ == "__main__":
    sys.exit(main())
