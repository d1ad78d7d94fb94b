"""ps: keep your model's parameters on the parameter servers, from NumPy or PyTorch.

    import ps
    client = ps.Client("job.textproto", servers=["host0:7000", "host1:7000"], worker_index=0)
    w = client.pull_dense("mlp/w0")                  # numpy float32, the table's shape
    client.push_dense("mlp/w0", grad)                # the servers' optimizer applies it
    rows = client.pull_sparse("emb", keys)           # keys: numpy uint64 -> (len(keys), dim)
    client.push_sparse("emb", keys, row_grads)
    client.clock()                                   # one step done (training.staleness)
    client.report_position(epoch, offset)            # for a restart: client.position()

worker_index has no default: 0..cluster.num_workers-1 for a training worker, -1 for a tool that
only reads (pulls, stats) and takes no part in the clock. A training worker resumes where the
servers saw it last (`client.steps`, `client.position()`). `ps.Client.centralized("job.textproto")`
runs the same tables, optimizers and checks in this process (as `ps_worker --centralized`).
Failures raise `ps.Error` subclasses named after the gRPC status code (`ps.InvalidArgument`,
`ps.NotFound`, ...). See docs/python.md.
"""

import collections
import importlib.util
import json
import operator
import os

import numpy as np

from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,  # noqa: F401
                     FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange, PermissionDenied,
                     ResourceExhausted, Unauthenticated, Unavailable, Unimplemented, Unknown)


def _load_extension():
    """ps._ps: next to this file (Bazel runfiles, an installed copy) or in the build tree."""
    try:
        from . import _ps
        return _ps
    except ImportError:
        pass
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "bazel-bin", "python", "ps", "_ps.so")
    if not os.path.exists(path):
        raise ImportError("ps: the extension ps/_ps.so is not built; run `bazel build //python:ps` "
                          "in %s" % root)
    spec = importlib.util.spec_from_file_location("ps._ps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ps = _load_extension()

TableInfo = collections.namedtuple("TableInfo", "name kind shape")
TableInfo.__doc__ = "A table of the job: kind 'dense' (shape = the tensor's) or 'sparse' (shape = (dim,))."

Position = collections.namedtuple("Position", "epoch offset clock")
Position.__doc__ = ("Where a worker is: epochs completed, examples consumed of the current epoch, and steps "
                    "completed (the clock), as the servers remember it.")


def _path(value, what):
    """A path argument (str or os.PathLike, e.g. pathlib.Path) as a str; None stays None."""
    if value is None:
        return None
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        raise InvalidArgument("%s must be a path (str or os.PathLike), not %s" % (what, type(value).__name__)) from None


def _config_text(config):
    """(text, source name) of a JobConfig given as a path (str or os.PathLike) or as textproto
    text (str)."""
    if isinstance(config, os.PathLike):
        config = _path(config, "config")  # always a file: a Path is never text
    elif not isinstance(config, str):
        raise InvalidArgument("config must be a JobConfig textproto path (str or os.PathLike) or its text (str), "
                              "not %s" % type(config).__name__)
    elif "\n" in config or "{" in config or (":" in config and not os.path.exists(config)):
        return config, "config text"
    try:
        with open(config) as f:
            return f.read(), config
    except FileNotFoundError:
        raise NotFound("no config file %s" % config) from None
    except OSError as e:
        raise InvalidArgument("cannot read config %s: %s" % (config, e)) from None


def _is_tensor(x):
    return hasattr(x, "detach") and hasattr(x, "numpy")


def _tensor_numpy(x, what, expected):
    """A tensor's .numpy(), or ps.InvalidArgument where torch has none (bfloat16, ...) instead
    of torch's TypeError."""
    try:
        return x.numpy()
    except TypeError:
        raise InvalidArgument("%s: a %s tensor, expected %s" % (what, x.dtype, expected)) from None


def _floats(x, what="gradient"):
    """An ndarray view of x without copying: CPU torch tensors through .numpy() (others are
    copied to the CPU first)."""
    if _is_tensor(x):
        return _tensor_numpy(x.detach().cpu(), what, "float32")
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InvalidArgument("%s: expected a float32 array or torch tensor (%s)" % (what, e)) from None


def _out(x, what="out"):
    """A pull's destination: None (a new array), an ndarray, or a CPU tensor's shared memory.
    A tensor on another device, or not float32, cannot take the pull's bytes in place (torch's
    own .numpy() raised TypeError for them): ps.InvalidArgument says so."""
    if x is not None and _is_tensor(x):
        if x.device.type != "cpu":
            raise InvalidArgument("%s: a tensor on %s; expected a CPU float32 tensor (the pull writes into its "
                                  "memory: pull into one and copy it to the device)" % (what, x.device))
        if str(x.dtype) != "torch.float32":
            raise InvalidArgument("%s: a %s tensor; expected a CPU float32 tensor" % (what, x.dtype))
        return x.detach().numpy()
    return x


def _keys(keys, what="keys"):
    if isinstance(keys, np.ndarray):
        return keys
    if _is_tensor(keys):
        return _tensor_numpy(keys.detach().cpu(), what, "uint64")
    try:
        return np.asarray(keys, dtype=np.uint64)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgument("%s: expected a numpy uint64 array (%s)" % (what, e)) from None


def _worker_index(worker_index):
    """worker_index as an int; there is no default, so that a client made to look at the
    servers does not take training worker 0's place (a newer incarnation of it: the real one's
    pushes would be refused)."""
    if worker_index is None:
        raise InvalidArgument("ps.Client needs worker_index: 0..cluster.num_workers-1 for a training worker, or -1 "
                              "for a tool that only reads (pulls, stats, checkpoints) and takes no part in the clock")
    if isinstance(worker_index, bool):
        raise InvalidArgument("worker_index must be an int, not bool")
    try:
        return operator.index(worker_index)
    except TypeError:
        raise InvalidArgument("worker_index must be an int, not %s" % type(worker_index).__name__) from None


def _count(value, what, bits):
    """A non-negative int below 2**bits (an epoch, an offset)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgument("%s must be an int, not %s" % (what, type(value).__name__)) from None
    if isinstance(value, bool) or not 0 <= n < 1 << bits:
        raise InvalidArgument("%s must be an int in [0, 2**%d), not %r" % (what, bits, value))
    return n


class _Closed:
    """Stands for the extension's client once closed: every use raises ps.FailedPrecondition."""

    def __getattr__(self, name):
        raise FailedPrecondition("the client is closed")


def _caller_outs(result, outs):
    """A pull's {name: array} with the caller's own `out` objects (e.g. torch tensors) where
    it gave one, as pull_dense returns."""
    for name, out in outs.items():
        if out is not None:
            result[name] = out
    return result


class Client:
    """A worker's connection to the job's parameter servers (or to in-process shards).

    Thread-safe; every call releases the GIL while it waits. Pulls write into float32
    C-contiguous arrays (`out=`, or a new one); pushes read float32 C-contiguous arrays (or CPU
    torch tensors) in place. Anything else raises ps.InvalidArgument before anything is sent.

    Clock: `clock()` ends a step. Pulls carry the steps completed so far, so under
    `training.staleness = k` a pull waits until every live worker has completed at least that
    many steps minus k (k = 0: a barrier every step; unset: never waits). A training worker's
    client starts at the clock the servers hold for it (a restarted worker resumes there).
    """

    def __init__(self, config, servers=None, worker_index=None, *, overrides=(), ca_cert=None, cert=None,
                 key=None, token_file=None, plaintext=None, wait_for_servers_s=60.0, _centralized=False,
                 _data_dir=None):
        """Connects to the servers of `config` (a JobConfig textproto path, str or os.PathLike, or
        its text).

        worker_index (required): this worker, 0..cluster.num_workers-1, or -1 for a tool that
        only reads (pulls, stats, checkpoints) outside the consistency bound. A second client
        with a worker's index replaces that worker on the servers (a newer incarnation: the
        first one's pushes are refused). A training worker resumes where the servers saw this
        index last: `steps` starts at its clock, `position()` gives its data position.
        servers: "host:port" strings in server-index order (default: the config's
        cluster.servers). overrides: "path=value" strings as ps_worker --set.
        ca_cert/cert/key/token_file/plaintext override the config's `security` section (mutual
        TLS files, bearer token file, or plaintext=True). Waits up to wait_for_servers_s for
        every server to answer with this job's layout (ps.Unavailable otherwise,
        ps.FailedPrecondition for a different layout).
        """
        worker_index = _worker_index(worker_index)
        text, source = _config_text(config)
        self._c = _ps.Client(
            config_text=text, config_source=source, overrides=list(overrides), servers=list(servers or []),
            worker_index=worker_index, centralized=_centralized, data_dir=_path(_data_dir, "data_dir") or "",
            ca_cert=_path(ca_cert, "ca_cert") or "", cert=_path(cert, "cert") or "", key=_path(key, "key") or "",
            token_file=_path(token_file, "token_file") or "",
            plaintext=-1 if plaintext is None else int(bool(plaintext)), wait_for_servers_s=wait_for_servers_s)
        self._tables = {t["name"]: TableInfo(t["name"], t["kind"], tuple(t["shape"])) for t in self._c.tables()}

    @classmethod
    def centralized(cls, config, *, overrides=(), data_dir=None):
        """The job's shards in this process (ps_worker --centralized): no servers, no sockets.

        data_dir: where checkpoint() writes (and what a new client resumes from); None = no
        checkpoints.
        """
        return cls(config, worker_index=0, overrides=overrides, _centralized=True, _data_dir=data_dir)

    # ---- Tables -----------------------------------------------------------------------------

    @property
    def tables(self):
        """{name: TableInfo} of the job's tables (model tables included)."""
        return dict(self._tables)

    @property
    def worker_index(self):
        return self._c.worker_index

    @property
    def num_workers(self):
        return self._c.num_workers

    @property
    def staleness(self):
        """training.staleness (None = fully asynchronous)."""
        s = self._c.staleness
        return None if s < 0 else s

    # ---- Data path --------------------------------------------------------------------------

    def pull_dense(self, table, out=None):
        """The whole dense table, as a float32 array of its shape (or written into `out`)."""
        dense, _ = self._c.pull({table: _out(out, "pull_dense %s out" % (table,))}, {})
        return dense[table] if out is None else out

    def push_dense(self, table, grad):
        """Sends the gradient of a whole dense table (float32, the table's element count)."""
        self._c.push({table: _floats(grad)}, {})

    def pull_sparse(self, table, keys, out=None):
        """Rows for `keys` (numpy uint64; duplicates allowed) as a (len(keys), dim) float32 array."""
        _, sparse = self._c.pull({}, {table: (_keys(keys), _out(out, "pull_sparse %s out" % (table,)))})
        return sparse[table] if out is None else out

    def push_sparse(self, table, keys, grads):
        """Gradient rows for `keys` ((len(keys), dim) float32; keys should be unique)."""
        self._c.push({}, {table: (_keys(keys), _floats(grads))})

    def pull(self, dense=(), sparse=None):
        """Several tables in one call (one round trip per server).

        dense: table names, or {name: out array}; sparse: {name: keys} or {name: (keys, out)}.
        Returns {name: array} for every table asked for.
        """
        outs = dict(dense) if isinstance(dense, dict) else {}
        dense = {k: _out(v, "pull_dense %s out" % (k,)) for k, v in dense.items()} if isinstance(dense, dict) \
            else {n: None for n in dense}
        sp = {}
        for name, v in (sparse or {}).items():
            keys, out = v if isinstance(v, tuple) else (v, None)
            sp[name] = (_keys(keys), _out(out, "pull_sparse %s out" % (name,)))
            outs[name] = out
        d, s = self._c.pull(dense, sp)
        result = dict(d)
        result.update(s)
        return _caller_outs(result, outs)

    def push(self, dense=None, sparse=None):
        """Several gradients in one call: dense {name: grad}, sparse {name: (keys, grads)}."""
        d = {name: _floats(g) for name, g in (dense or {}).items()}
        s = {name: (_keys(k), _floats(g)) for name, (k, g) in (sparse or {}).items()}
        self._c.push(d, s)

    def step(self, push_dense=None, push_sparse=None, pull_dense=(), pull_sparse=None):
        """One fused training step: pushes this step's gradients (as push()), ends the step (as
        clock()) and pulls the next step's parameters (as pull()), in one round trip per server.
        The pull sees the push. Returns {name: array} of the pull; .steps is the new clock."""
        outs = dict(pull_dense) if isinstance(pull_dense, dict) else {}
        pd = {k: _out(v, "pull_dense %s out" % (k,)) for k, v in pull_dense.items()} if isinstance(pull_dense, dict) \
            else {n: None for n in pull_dense}
        ps_ = {}
        for name, v in (pull_sparse or {}).items():
            keys, out = v if isinstance(v, tuple) else (v, None)
            ps_[name] = (_keys(keys), _out(out, "pull_sparse %s out" % (name,)))
            outs[name] = out
        d = {name: _floats(g) for name, g in (push_dense or {}).items()}
        s = {name: (_keys(k), _floats(g)) for name, (k, g) in (push_sparse or {}).items()}
        _, dense_out, sparse_out = self._c.step(d, s, pd, ps_)
        result = dict(dense_out)
        result.update(sparse_out)
        return _caller_outs(result, outs)

    def clock(self):
        """Ends a step and returns the number of steps completed. The servers learn the new clock
        from this step's pushes, or from an empty push if it made none."""
        return self._c.tick()

    @property
    def steps(self):
        """Steps completed (the clock pulls carry); a restarted worker starts at its old clock."""
        return self._c.clock

    def position(self):
        """ps.Position(epoch, offset, clock): where this worker stood when the client was created,
        as the servers (or a centralized data_dir) remember it: the data position an earlier
        process of this worker index last reported (report_position) and the clock the servers
        hold for it (`steps` started there). Zeros for a new worker and for a tool (-1)."""
        return Position(*self._c.start_position)

    def report_position(self, epoch, offset):
        """Tells the servers where this worker is in its data: `epoch` epochs completed and
        `offset` examples consumed of the current one (0, 0 says nothing new), so that a
        restarted worker's data loader can resume there (position()). Report after the step's
        pushes, as ps_worker does; the servers keep it (also in their checkpoints). Returns
        the ps.Position they remember. ps.FailedPrecondition for a tool."""
        return Position(*self._c.report_position(_count(epoch, "epoch", 32), _count(offset, "offset", 64)))

    # ---- Administration ---------------------------------------------------------------------

    def checkpoint(self):
        """Writes a checkpoint on every server now; one dict per server (checkpoint_id, bytes, ...)."""
        return [json.loads(s) for s in self._c.checkpoint()]

    def stats(self):
        """Every server's Stats (tables, pulls, pushes, rejected requests by reason, worker
        clocks, ...), one dict per server."""
        return [json.loads(s) for s in self._c.stats()]

    def finish(self):
        """This worker pushes no more: it leaves the consistency bound (the servers stop once
        every worker has finished). Idempotent; also done when the client is closed."""
        self._c.finish()

    def close(self):
        """Finishes (as finish()) and lets go of the connections; later calls raise
        ps.FailedPrecondition. Idempotent."""
        if not isinstance(self._c, _Closed):
            try:
                self._c.finish()
            finally:
                self._c = _Closed()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        # The body's exception is the one to see: a failure to finish (servers gone, often
        # the same cause) does not replace it.
        try:
            self.close()
        except Error:
            pass


def load_data(config, overrides=()):
    """The job's data section as NumPy arrays (the same readers and generator as ps_worker).

    Returns {"train": d, "test": d or None, "ground_truth_auc": float}; d is {"x", "y"} for
    images (float32 (n, features), int32 labels), or CSR {"offsets", "ids", "values", "y"} for
    sparse data (uint64 ids, float32 binary labels).
    """
    text, source = _config_text(config)
    return _ps.load_data(text, source, list(overrides))


def auc(scores, labels):
    """Area under the ROC curve, as the C++ trainer computes it."""
    return _ps.auc(np.asarray(scores, dtype=np.float32), np.asarray(labels, dtype=np.float32))
