"""ps: keep your model's parameters on the parameter servers, from NumPy or PyTorch.

    import ps
    client = ps.Client("job.textproto", servers=["host0:7000", "host1:7000"], worker_index=0)
    w = client.pull_dense("mlp/w0")                  # numpy float32, the table's shape
    client.push_dense("mlp/w0", grad)                # the servers' optimizer applies it
    rows = client.pull_sparse("emb", keys)           # keys: numpy uint64 -> (len(keys), dim)
    client.push_sparse("emb", keys, row_grads)
    client.clock()                                   # one step done (training.staleness)

`ps.Client.centralized("job.textproto")` runs the same tables, optimizers and checks in this
process (as `ps_worker --centralized`). Failures raise `ps.Error` subclasses named after the
gRPC status code (`ps.InvalidArgument`, `ps.NotFound`, ...). See docs/python.md.
"""

import collections
import importlib.util
import json
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


def _config_text(config):
    """(text, source name) of a JobConfig given as a path or as textproto text."""
    if "\n" in config or "{" in config or (":" in config and not os.path.exists(config)):
        return config, "config text"
    try:
        with open(config) as f:
            return f.read(), config
    except FileNotFoundError:
        raise NotFound("no config file %s" % config) from None
    except OSError as e:
        raise InvalidArgument("cannot read config %s: %s" % (config, e)) from None


def _floats(x):
    """An ndarray view of x without copying: torch tensors through .numpy()."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(x, dtype=np.float32)


def _out(x):
    """A pull's destination: None (a new array), an ndarray, or a CPU tensor's shared memory."""
    if x is not None and hasattr(x, "detach") and hasattr(x, "numpy"):
        return x.detach().numpy()
    return x


def _keys(keys):
    if isinstance(keys, np.ndarray):
        return keys
    if hasattr(keys, "detach") and hasattr(keys, "numpy"):
        return keys.detach().cpu().numpy()
    return np.asarray(keys, dtype=np.uint64)


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
    many steps minus k (k = 0: a barrier every step; unset: never waits).
    """

    def __init__(self, config, servers=None, worker_index=0, *, overrides=(), ca_cert=None, cert=None,
                 key=None, token_file=None, plaintext=None, wait_for_servers_s=60.0, _centralized=False,
                 _data_dir=None):
        """Connects to the servers of `config` (a JobConfig textproto path or text).

        servers: "host:port" strings in server-index order (default: the config's
        cluster.servers). worker_index: this worker, 0..cluster.num_workers-1 (-1: a tool
        outside the consistency bound). overrides: "path=value" strings as ps_worker --set.
        ca_cert/cert/key/token_file/plaintext override the config's `security` section (mutual
        TLS files, bearer token file, or plaintext=True). Waits up to wait_for_servers_s for
        every server to answer with this job's layout (ps.Unavailable otherwise,
        ps.FailedPrecondition for a different layout).
        """
        text, source = _config_text(config)
        self._c = _ps.Client(
            config_text=text, config_source=source, overrides=list(overrides), servers=list(servers or []),
            worker_index=worker_index, centralized=_centralized, data_dir=_data_dir or "",
            ca_cert=ca_cert or "", cert=cert or "", key=key or "", token_file=token_file or "",
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
        dense, _ = self._c.pull({table: _out(out)}, {})
        return dense[table] if out is None else out

    def push_dense(self, table, grad):
        """Sends the gradient of a whole dense table (float32, the table's element count)."""
        self._c.push({table: _floats(grad)}, {})

    def pull_sparse(self, table, keys, out=None):
        """Rows for `keys` (numpy uint64; duplicates allowed) as a (len(keys), dim) float32 array."""
        _, sparse = self._c.pull({}, {table: (_keys(keys), _out(out))})
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
        dense = {k: _out(v) for k, v in dense.items()} if isinstance(dense, dict) else {n: None for n in dense}
        sp = {}
        for name, v in (sparse or {}).items():
            keys, out = v if isinstance(v, tuple) else (v, None)
            sp[name] = (_keys(keys), _out(out))
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
        pd = {k: _out(v) for k, v in pull_dense.items()} if isinstance(pull_dense, dict) \
            else {n: None for n in pull_dense}
        ps_ = {}
        for name, v in (pull_sparse or {}).items():
            keys, out = v if isinstance(v, tuple) else (v, None)
            ps_[name] = (_keys(keys), _out(out))
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
        """Steps completed (the clock pulls carry)."""
        return self._c.clock

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
