"""Local clusters for examples and tests: ps_server processes on free ports of 127.0.0.1.

    with ps.cluster.LocalServers("job.textproto", num_servers=2) as servers:
        client = ps.Client("job.textproto", servers=servers.addresses, worker_index=0)

    # Or a whole job: servers plus one Python process per worker, as tools/launch_local.py
    # runs ps_worker processes (each worker gets --worker_index=i --servers=h:p,...).
    ps.cluster.run_job("job.textproto", [sys.executable, "train.py"], num_workers=2)

run_job starts the workers with OPENBLAS_CORETYPE set where NumPy's and PyTorch's OpenBLAS
would run kernels without AVX on this CPU (blas_core_environment).

Servers are started as tools/launch_local.py starts them (--port=0 with a port file, a data
dir each, plaintext as the config says) and stopped with SIGTERM (a final checkpoint); no
process is left behind when the caller exits or is killed (PR_SET_PDEATHSIG: see LocalServers),
nor when starting fails.
"""

import ctypes
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def _repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_binary(rel):
    """bazel-bin/<rel> or the runfiles' <rel> (rel: "server/ps_server")."""
    candidates = []
    if os.environ.get("PS_BIN_DIR"):
        candidates.append(os.path.join(os.environ["PS_BIN_DIR"], rel))
    if os.environ.get("TEST_SRCDIR"):
        candidates.append(os.path.join(os.environ["TEST_SRCDIR"], "ps", rel))
    candidates.append(os.path.join(_repo_root(), "bazel-bin", rel))
    candidates.append(os.path.join(_repo_root(), rel))  # a runfiles tree
    for c in candidates:
        if os.access(c, os.X_OK) and os.path.isfile(c):
            return c
    raise FileNotFoundError("%s not found (looked in %s); build it: bazel build //%s:%s" % (
        rel, ", ".join(candidates), os.path.dirname(rel), os.path.basename(rel)))


# OpenBLAS's x86 kernel sets whose kernels use no AVX (its choice for CPUs it does not know:
# Debian 12's OpenBLAS gives Intel's model 207 the Prescott set). The rule is ps_worker's
# (kernels/blas_core.h), for the NumPy and PyTorch workers this module starts.
_BLAS_SETS_WITHOUT_AVX = {"katmai", "coppermine", "northwood", "prescott", "banias", "atom",
                          "core2", "penryn", "dunnington", "nehalem", "opteron", "opteron_sse3",
                          "barcelona", "nano"}


def better_blas_core(chosen, cpu_flags):
    """The OpenBLAS kernel set to name in OPENBLAS_CORETYPE when OpenBLAS chose `chosen` on a
    CPU with `cpu_flags` (/proc/cpuinfo's names): SkylakeX with AVX-512, Haswell with AVX2 and
    FMA, Sandybridge with AVX, when the chosen set uses no AVX; else None."""
    if (chosen or "").lower() not in _BLAS_SETS_WITHOUT_AVX:
        return None
    flags = set(cpu_flags)
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    if "avx" in flags:
        return "Sandybridge"
    return None


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def blas_core_environment(environ=None):
    """{"OPENBLAS_CORETYPE": set} for worker processes whose NumPy or PyTorch would run OpenBLAS
    kernels without AVX on this CPU (a model OpenBLAS does not know: 2-4x slower matrix
    products), or {} (the variable set already, another BLAS, or nothing better)."""
    environ = os.environ if environ is None else environ
    if "OPENBLAS_CORETYPE" in environ:
        return {}
    try:
        blas = ctypes.CDLL("libopenblas.so.0")
        blas.openblas_get_corename.restype = ctypes.c_char_p
        blas.openblas_get_config.restype = ctypes.c_char_p
        if b"DYNAMIC_ARCH" not in (blas.openblas_get_config() or b""):
            return {}
        chosen = (blas.openblas_get_corename() or b"").decode("ascii", "replace")
    except (OSError, AttributeError):
        return {}
    better = better_blas_core(chosen, _cpu_flags())
    return {"OPENBLAS_CORETYPE": better} if better else {}


def _load_prctl():
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, here: the child of a fork must not load a library (dlopen takes locks that
# another thread of the parent may have held at the fork, and the child would wait for ever).
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1
_SIGTERM = int(signal.SIGTERM)


def _die_with_parent(parent_pid):
    """preexec_fn (in the child, between fork and exec): SIGTERM when the parent goes."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, _SIGTERM)
    # A parent that died before prctl sends no signal any more: the child was reparented, so
    # it goes now instead of running on unowned.
    if os.getppid() != parent_pid:
        os._exit(1)


def _die_with_this_process():
    """The preexec_fn for a child of this process (see _die_with_parent)."""
    return functools.partial(_die_with_parent, os.getpid())


class LocalServers:
    """num_servers ps_server processes of `config` on 127.0.0.1; `.addresses` once started.

    The servers get SIGTERM when whoever started them goes (PR_SET_PDEATHSIG). Linux ties that
    to the thread that started them, not to the process: the servers are stopped when the
    thread that called start() (or entered the `with`) exits, even while the rest of the
    process runs on. Start them from a thread that outlives them (the main thread, say).

    A start that fails (a server that exits or stays silent, an exception, Ctrl-C) stops the
    servers it started and removes the data root it made before it raises.
    """

    def __init__(self, config, num_servers=None, overrides=(), data_root=None, server_args=(),
                 start_timeout=120.0, quiet=True):
        self.config = os.path.abspath(config)
        self.num_servers = num_servers or _config_int(self.config, "num_servers", overrides) or 1
        self.overrides = list(overrides) + ["cluster.num_servers=%d" % self.num_servers]
        self._own_root = data_root is None
        # A root of our own is made by start(): an object never started leaves nothing behind.
        self.data_root = data_root
        self.server_args = list(server_args)
        self.start_timeout = start_timeout
        self.quiet = quiet
        self.procs = []
        self.addresses = []

    def start(self):
        # `with` does not call __exit__ when __enter__ raises: whatever went wrong, the
        # servers started so far and the data root go before the exception leaves.
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self):
        binary = find_binary("server/ps_server")
        if self._own_root and self.data_root is None:
            self.data_root = tempfile.mkdtemp(prefix="ps-servers-", dir=os.environ.get("TEST_TMPDIR"))
        port_files = []
        for i in range(self.num_servers):
            port_file = os.path.join(self.data_root, "server-%d.port" % i)
            if os.path.exists(port_file):
                os.remove(port_file)
            port_files.append(port_file)
            argv = [binary, "--config=" + self.config, "--server_index=%d" % i, "--cluster_from=flags",
                    "--host=127.0.0.1", "--port=0", "--port_file=" + port_file,
                    "--data_dir=" + os.path.join(self.data_root, "server-%d" % i),
                    "--set=" + ",".join(self.overrides)] + self.server_args
            with open(os.path.join(self.data_root, "server-%d.log" % i), "wb") as log:
                self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   preexec_fn=_die_with_this_process()))
        deadline = time.time() + self.start_timeout
        for i, (p, port_file) in enumerate(zip(self.procs, port_files)):
            while not os.path.exists(port_file):
                if p.poll() is not None:
                    raise RuntimeError("ps_server %d exited with code %s while starting:\n%s" % (
                        i, p.returncode, self.log(i)))
                if time.time() > deadline:
                    raise RuntimeError("ps_server %d did not start within %.0f s" % (i, self.start_timeout))
                time.sleep(0.02)
            with open(port_file) as f:
                self.addresses.append("127.0.0.1:%d" % int(f.read().strip()))
        return self

    def log(self, i):
        if self.data_root is None:
            return ""
        try:
            with open(os.path.join(self.data_root, "server-%d.log" % i), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait(self, timeout):
        """Waits for every server to exit by itself (after every worker finished); exit codes."""
        deadline = time.time() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def stop(self, timeout=30.0):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._own_root and self.data_root is not None:
            shutil.rmtree(self.data_root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _config_int(path, field, overrides=()):
    """cluster.`field` (num_servers, num_workers) as the binaries read the config: ps_server
    --print_config, the file with `overrides` applied (not a parser of this module's own).
    None when the config leaves it 0."""
    argv = [find_binary("server/ps_server"), "--config=" + path, "--cluster_from=flags",
            "--print_config"]
    if overrides:
        argv.append("--set=" + ",".join(overrides))
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("ps_server --print_config --config=%s: %s" % (
            path, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]))
    return int(json.loads(p.stdout).get("cluster", {}).get(field, 0)) or None


def run_job(config, worker_argv, num_workers=None, num_servers=None, overrides=(), timeout=None):
    """Starts the servers, then `num_workers` copies of worker_argv (each with
    --worker_index=i --servers=...; their output goes to this process's); returns the workers'
    exit codes once all have exited (the servers are stopped in any case)."""
    num_workers = num_workers or _config_int(os.path.abspath(config), "num_workers", overrides) or 1
    overrides = list(overrides) + ["cluster.num_workers=%d" % num_workers]
    with LocalServers(config, num_servers=num_servers, overrides=overrides) as servers:
        sys.stdout.write("[job] servers at %s\n" % ",".join(servers.addresses))
        sys.stdout.flush()
        env = dict(os.environ)
        blas = blas_core_environment(env)
        if blas:
            sys.stdout.write("[job] OpenBLAS would run kernels without AVX on this CPU; the workers "
                             "start with OPENBLAS_CORETYPE=%s\n" % blas["OPENBLAS_CORETYPE"])
            env.update(blas)
        sys.stdout.flush()
        workers = []
        deadline = None if timeout is None else time.time() + timeout
        codes = []
        try:
            # Started inside the try: a worker that fails to start (or Ctrl-C) ends the ones
            # started before it.
            for i in range(num_workers):
                argv = list(worker_argv) + ["--worker_index=%d" % i, "--servers=" + ",".join(servers.addresses)]
                workers.append(subprocess.Popen(argv, env=env, preexec_fn=_die_with_this_process()))
            for w in workers:
                codes.append(w.wait(None if deadline is None else max(0.1, deadline - time.time())))
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
        for i, code in enumerate(codes):
            if code != 0:
                sys.stdout.write("[job] worker %d exited with code %s\n" % (i, code))
        return codes
