"""PyTorch on the parameter servers: an embedding bag whose table lives on the servers, and a
helper that keeps a module's dense parameters there.

    emb = ps.torch.EmbeddingBag(client, "ctr/embedding", mode="sum")
    out = emb(keys, offsets)          # keys: numpy uint64; pulls the batch's unique rows
    loss.backward()                   # pushes their row gradients (the servers' optimizer)

    params = ps.torch.DenseParameters(client, model)   # table name = parameter name
    params.pull()                     # writes the servers' values into the parameters in place
    loss.backward(); params.push()    # one push of every parameter's gradient
    client.clock()

Needs torch (Debian's python3-torch); importing this module without it raises ImportError.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F


class _PullRows(torch.autograd.Function):
    """rows = the table's rows for `keys` (pulled in forward); backward pushes d(loss)/d(rows).

    `anchor` is a 0-element tensor that requires grad: it puts the pulled rows on the autograd
    graph, so that backward runs, without being a parameter anyone updates locally.
    """

    @staticmethod
    def forward(ctx, anchor, client, table, keys):
        ctx.client, ctx.table, ctx.keys = client, table, keys
        return torch.from_numpy(client.pull_sparse(table, keys))

    @staticmethod
    def backward(ctx, grad_rows):
        grad = grad_rows.detach().to(torch.float32).contiguous()
        ctx.client.push_sparse(ctx.table, ctx.keys, grad.numpy())
        return None, None, None, None


def pull_rows(client, table, keys, anchor):
    """The rows of `keys` (unique numpy uint64) as a tensor whose gradient is pushed in backward."""
    return _PullRows.apply(anchor, client, table, keys)


class EmbeddingBag(torch.nn.Module):
    """torch.nn.EmbeddingBag over a sparse table on the servers.

    forward(keys, offsets, per_sample_weights=None): keys is a 1-D numpy uint64 array (hashed
    ids; torch has no uint64), offsets a 1-D int64 tensor or array of bag starts. Each call
    pulls the rows of the batch's unique keys once; backward pushes one gradient row per unique
    key (summed over the bags that used it), and the servers' optimizer applies it.
    """

    def __init__(self, client, table, mode="sum"):
        super().__init__()
        info = client.tables.get(table)
        if info is None or info.kind != "sparse":
            raise ValueError("%s is not a sparse table of the job" % table)
        self.client, self.table, self.mode = client, table, mode
        self.dim = info.shape[0]
        self._anchor = torch.zeros(0, requires_grad=True)

    def forward(self, keys, offsets, per_sample_weights=None):
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        unique, inverse = np.unique(keys, return_inverse=True)
        rows = pull_rows(self.client, self.table, unique, self._anchor)
        return F.embedding_bag(torch.from_numpy(inverse.astype(np.int64)), rows,
                               torch.as_tensor(np.asarray(offsets), dtype=torch.int64), mode=self.mode,
                               per_sample_weights=per_sample_weights)


class DenseParameters:
    """Keeps every parameter of `module` in the dense table of the same name (prefix + name).

    pull() writes the servers' values straight into the parameters' storage (no copy in
    Python), all tables in one call; push() sends every parameter's .grad in one call and
    clears it (a parameter whose .grad is None, e.g. frozen, is not sent, so the servers'
    optimizer leaves it as torch's would). The servers' optimizer updates the values: do not step a local optimizer.
    The config must declare the tables, with the parameters' shapes (`tables_text` writes them).
    """

    def __init__(self, client, module, prefix=""):
        self.client = client
        self.params = [(prefix + name, p) for name, p in module.named_parameters()]
        tables = client.tables
        for name, p in self.params:
            info = tables.get(name)
            if info is None or info.kind != "dense":
                raise ValueError("the job has no dense table %s for parameter %s" % (name, name[len(prefix):]))
            if tuple(info.shape) != tuple(p.shape):
                raise ValueError("table %s has shape %s, the parameter %s" % (name, info.shape, tuple(p.shape)))
            if p.dtype != torch.float32 or not p.is_contiguous():
                raise ValueError("parameter %s must be a contiguous float32 tensor" % name)

    def pull(self):
        with torch.no_grad():
            self.client.pull(dense={name: p.detach().numpy() for name, p in self.params})

    def push(self):
        # A parameter without a gradient (frozen, or unused this step) is left out, as torch's
        # optimizers skip it: a zero gradient would still move it on the servers (weight decay,
        # momentum, Adam's moments). client.clock() carries the step's clock if nothing is sent.
        grads = {name: p.grad.detach().contiguous().numpy() for name, p in self.params if p.grad is not None}
        if grads:
            self.client.push(dense=grads)
        for _, p in self.params:
            p.grad = None


def _initializer(name, p):
    """InitializerConfig text for parameter `name` of torch's usual layers."""
    if p.dim() == 2:
        # Symmetric in fan-in and fan-out, so torch's [out, in] layout is fine.
        return "kind: GLOROT_UNIFORM"
    if p.dim() > 2:
        # A convolution's [out, in, kernel...]: torch's own default, uniform in +/- 1/sqrt(fan_in).
        bound = 1.0 / math.sqrt(max(1, p[0].numel()))
        return "kind: UNIFORM low: %.9g high: %.9g" % (-bound, bound)
    if name.rsplit(".", 1)[-1] == "weight":
        # A 1-D weight scales (LayerNorm, BatchNorm, GroupNorm): torch starts it at 1; at 0 no
        # gradient would reach the layers before it.
        return "kind: CONSTANT value: 1"
    return "kind: ZEROS"  # biases


def tables_text(module, prefix="", optimizer="kind: ADAM learning_rate: 0.001"):
    """JobConfig `tables { ... }` entries for every parameter of `module`: a dense table of its
    shape with `optimizer` (OptimizerConfig text), initialized as torch's layers start: 2-D
    weights GLOROT_UNIFORM, convolution weights uniform in +/- 1/sqrt(fan_in), 1-D weights
    (normalization scales) ones, biases zeros."""
    out = []
    for name, p in module.named_parameters():
        out.append('tables { name: "%s%s" kind: TABLE_KIND_DENSE shape: [%s] initializer { %s } '
                   'optimizer { %s } }' % (prefix, name, ", ".join(str(d) for d in p.shape), _initializer(name, p),
                                          optimizer))
    return "\n".join(out)
