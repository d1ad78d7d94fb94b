"""A model's bytes per training step, from its config: what a worker pulls and pushes.

Used by the advisor (tools/ps_advise.py) and the crossover study (studies/crossover_study.py).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_common import effective_config, get  # noqa: E402


def load(bin_dir, config, sets):
    """The config as the binaries run it (ps_server --print_config with the --set overrides
    `sets` applied), as launch_common.effective_config's dict."""
    return effective_config(bin_dir, config, sets)


def period_bytes(cfg, batch, ks):
    """{k: bytes a worker moves for k steps in one transfer / bytes of one step}: 1 for an MLP
    (the whole model either way); for a CTR model the rows of k batches, fewer than k times
    one batch's (popular keys repeat)."""
    one = model_bytes(cfg, batch)[1]
    return {k: model_bytes(cfg, batch * k)[1] / one for k in ks}


def model_bytes(cfg, batch):
    """(kind, pull bytes, push bytes, unique keys per batch or 0) of one step of one worker."""
    if get(cfg, "model.mlp") is not None:
        sizes = [int(get(cfg, "model.mlp.input_dim", 784))]
        sizes += [int(h) for h in get(cfg, "model.mlp.hidden", [])]
        sizes.append(int(get(cfg, "model.mlp.num_classes", 10)))
        params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        return "mlp", 4 * params, 4 * params, 0, params
    if get(cfg, "model.ctr") is not None:
        dim = int(get(cfg, "model.ctr.embedding_dim", 16))
        fields = int(get(cfg, "data.synthetic.num_fields", 8))
        vocab = int(get(cfg, "data.synthetic.vocabulary_per_field", 10000))
        s = float(get(cfg, "data.synthetic.zipf_exponent", 1.1))
        weights = [(v + 1) ** -s for v in range(vocab)]
        total = sum(weights)
        # E[distinct values of one field in a batch] = sum_v 1 - (1 - p_v)^b.
        unique = fields * sum(1 - (1 - w / total) ** batch for w in weights)
        row = 8 + 4 * dim
        dense = 4 * (dim + 1)
        return "ctr", unique * row + dense, unique * row + dense, unique, int(unique) * dim
    raise SystemExit("ps_advise: the config has neither model.mlp nor model.ctr")


def busiest_server_share(cfg, servers):
    """The largest fraction of a step's bytes one of `servers` servers carries. Dense tables are
    cut into blocks of cluster.dense_block_floats values, block b of the config's whole list of
    blocks on server b mod `servers` (common::Partitioner::ServerForBlock), so a model whose
    tables are few blocks lands unevenly: an MLP 784-64-10 is 99.9% on one server of two.
    Sparse rows spread over the servers by key hash (1 / servers)."""
    if servers <= 1:
        return 1.0
    block = int(get(cfg, "cluster.dense_block_floats", 65536))
    on = [0] * servers
    first = 0
    for t in cfg.get("tables", []):
        if t.get("kind", "TABLE_KIND_DENSE") != "TABLE_KIND_DENSE":
            continue
        numel = 1
        for d in t.get("shape", []):
            numel *= int(d)
        blocks = (numel + block - 1) // block
        for b in range(blocks):
            on[(first + b) % servers] += min(block, numel - b * block)
        first += blocks
    if get(cfg, "model.mlp") is None or not sum(on):
        return 1.0 / servers
    return max(on) / sum(on)


def step_bytes(bin_dir, config, sets):
    """(push bytes, pull bytes) of one worker step of config with --set overrides `sets`."""
    cfg = load(bin_dir, config, sets)
    _, pull_b, push_b, _, _ = model_bytes(cfg, int(get(cfg, "training.batch_size", 64)))
    return push_b, pull_b
