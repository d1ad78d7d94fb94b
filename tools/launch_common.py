"""What the launchers share: child processes with prefixed output, and reading a JobConfig.

tools/launch_local.py (one machine) and tools/launch_ssh.py (several hosts) start ps_server
and ps_worker processes through Proc. Every tool reads a config as the binaries do:
effective_config asks ps_server for it (--print_config: the file with the --set overrides
applied, the model's tables expanded), and get() reads a field of it. Nothing here knows about
hosts or Kubernetes.
"""

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent():
    """preexec_fn: the child gets SIGTERM if the launcher dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class Stopped(Exception):
    """Raised by StopRequest.check() in the main loop once SIGINT or SIGTERM arrived."""

    def __init__(self, signum):
        Exception.__init__(self, "signal %d" % signum)
        self.signum = signum


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag that the launcher's main loop polls.

    A Python signal handler runs in the main thread between any two bytecodes, also while that
    thread is inside say() holding the output lock or inside a buffered write to stdout; a
    handler that printed or stopped processes from there deadlocked on the lock (or failed with
    "reentrant call"). So the handler only records the signal; check() raises Stopped where the
    main loop can act on it safely.
    """

    def __init__(self, signals=(signal.SIGINT, signal.SIGTERM)):
        self.signum = None
        for sig in signals:
            signal.signal(sig, self._handler)

    def _handler(self, signum, _frame):
        if self.signum is None:
            self.signum = signum

    def requested(self):
        return self.signum is not None

    def check(self):
        if self.signum is not None:
            raise Stopped(self.signum)


def effective_config(bin_dir, config, sets):
    """The job config as ps_server runs it: the file with the --set overrides `sets` applied by
    the binary itself (`ps_server --print_config`), as a dict of the proto's JSON form (field
    names as in config.proto; 64-bit integers as strings). Raises RuntimeError with the
    binary's message when it refuses the config."""
    argv = [os.path.join(bin_dir, "server", "ps_server"), "--config=" + config, "--cluster_from=flags",
            "--print_config"]
    if sets:
        argv.append("--set=" + ",".join(sets))
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1])
    return json.loads(p.stdout)


def worker_certificates(cfg, num_workers):
    """Per worker j, the overrides that give it its own identity under mutual TLS: servers
    accept a worker's pushes only under the certificate naming it (tools/make_certs.sh writes
    worker-J.pem/.key beside server.pem). [] for every worker of a plaintext job or where the
    config's certificate directory holds no worker-J pair (the config's own cert is used)."""
    security = cfg.get("security", {})
    cert = security.get("cert", "")
    if security.get("plaintext") or not cert:
        return [[] for _ in range(num_workers)]
    out = []
    for j in range(num_workers):
        base = os.path.join(os.path.dirname(cert), "worker-%d" % j)
        if os.path.exists(base + ".pem") and os.path.exists(base + ".key"):
            out.append(["security.cert=%s.pem" % base, "security.key=%s.key" % base])
        else:
            out.append([])
    return out


def exit_status(code):
    """A failed child's Popen returncode as the launcher's exit status: its own code, 128 + N
    when signal N ended it, 1 when it gives none (still running, or 0)."""
    if not code:
        return 1
    return code if code > 0 else 128 - code


def worker_args(args, index):
    """The --worker_arg flags of worker `index`: {index} replaced by it (per-worker log files)."""
    return [a.replace("{index}", str(index)) for a in args]


def split_overrides(value):
    """The overrides in one --set flag's value, split as the binaries split it
    (common/config/overrides.h): a comma starts a new override only where the text up to the
    next comma holds '='; otherwise it belongs to a list value (model.mlp.hidden=256,128)."""
    out = []
    for token in value.split(",") if value else []:
        if "=" not in token and out:
            out[-1] += "," + token
        else:
            out.append(token)
    return out


def merge_sets(own, flags, fixed=()):
    """(set_flag, rest): one --set flag ([] when there is nothing to set) and `flags` without
    their --set flags. The binaries keep only the last --set flag, so a --set among the user's
    --server_arg/--worker_arg flags would drop the launcher's. The overrides go in this order, a
    later one winning for the same path: `own`, those of `flags` (the user's extra flags), then
    `fixed`, the cluster's counts the launcher starts processes for. Raises ValueError where
    `flags` give a path of `fixed` another value."""
    extra, rest = [], []
    it = iter(flags)
    for flag in it:
        if flag in ("--set", "-set"):
            value = next(it, None)
            if value is None:
                rest.append(flag)  # no value: the binary names the error
            else:
                extra += split_overrides(value)
        elif flag.startswith(("--set=", "-set=")):
            extra += split_overrides(flag.split("=", 1)[1])
        else:
            rest.append(flag)
    pinned = dict(o.split("=", 1) for o in fixed)
    for o in extra:
        path, _, value = o.partition("=")
        if path in pinned and value != pinned[path]:
            raise ValueError("--set %s: the launcher runs this job with %s=%s" % (o, path, pinned[path]))
    overrides = list(own) + extra + list(fixed)
    return (["--set=" + ",".join(overrides)] if overrides else []), rest


def drop_restore(flags):
    """`flags` without their --restore flags (--restore=X and the two words --restore X)."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in ("--restore", "-restore"):
            skip = True
        elif not flag.startswith(("--restore=", "-restore=")):
            out.append(flag)
    return out


def cluster_size(cfg):
    """(servers, workers) of an effective_config: cluster.num_servers (else the number of
    cluster.servers), cluster.num_workers."""
    cluster = cfg.get("cluster", {})
    servers = int(cluster.get("num_servers") or 0) or len(cluster.get("servers", [])) or 1
    return servers, int(cluster.get("num_workers") or 0) or 1


class Proc:
    """A child process whose output lines are printed as "[prefix] line" and kept in a log.

    on_line(line), when given, is called (on the reader thread) for every line.
    """

    def __init__(self, name, argv, out_lock, log_dir, prefix=None, on_line=None):
        self.name = name
        self.argv = argv
        self.out_lock = out_lock
        self.prefix = prefix or name
        self.on_line = on_line
        self.log_path = os.path.join(log_dir, name.replace(" ", "_") + ".log")
        self.log = open(self.log_path, "a")
        self.lines = []
        self.start()

    def start(self):
        self.popen = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent, start_new_session=True, bufsize=0)
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
            sys.stdout.write("[%s] %s\n" % (self.prefix, line))
            sys.stdout.flush()
        if self.on_line is not None:
            self.on_line(line)

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


def get(cfg, path, default=None):
    """The value at a dotted path ("cluster.num_servers") of an effective_config dict, or
    default where a field on the way is unset (the JSON form leaves out fields at their
    default). 64-bit integers come as strings: convert with int()."""
    node = cfg
    for name in path.split("."):
        if not isinstance(node, dict) or name not in node:
            return default
        node = node[name]
    return node
