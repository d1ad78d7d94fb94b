"""A model's bytes per training step, from its config: what a worker pulls and pushes.

Used by the advisor (tools/ps_advise.py) and the crossover study (studies/crossover_study.py).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_common import parse_textproto  # noqa: E402


def read_text(path):
    with open(path) as f:
        return f.read()


def _get(cfg, path, default=None):
    """A value of the parsed config ({field: [values]}); "hidden" gives the whole list."""
    node = cfg
    for part in path.split("."):
        values = node.get(part) if isinstance(node, dict) else None
        if not values:
            return default
        if part == "hidden":
            return values
        node = values[-1]
    return node


def apply_sets(cfg, sets):
    """Applies --set path=value[,path=value] overrides (as the binaries take them) to cfg."""
    for group in sets:
        for item in re.split(r",(?=[a-z_.]+=)", group):
            path, _, value = item.partition("=")
            parts = path.split(".")
            node = cfg
            for p in parts[:-1]:
                values = node.setdefault(p, [{}])
                node = values[-1]
            if parts[-1] == "hidden":
                node["hidden"] = [int(v) for v in value.split(",") if v]
            else:
                node[parts[-1]] = [value]
    return cfg


def period_bytes(cfg, batch, ks):
    """{k: bytes a worker moves for k steps in one transfer / bytes of one step}: 1 for an MLP
    (the whole model either way); for a CTR model the rows of k batches, fewer than k times
    one batch's (popular keys repeat)."""
    one = model_bytes(cfg, batch)[1]
    return {k: model_bytes(cfg, batch * k)[1] / one for k in ks}


def model_bytes(cfg, batch):
    """(kind, pull bytes, push bytes, unique keys per batch or 0) of one step of one worker."""
    if _get(cfg, "model.mlp") is not None:
        sizes = [int(_get(cfg, "model.mlp.input_dim", 784))]
        sizes += [int(h) for h in _get(cfg, "model.mlp.hidden", [])]
        sizes.append(int(_get(cfg, "model.mlp.num_classes", 10)))
        params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        return "mlp", 4 * params, 4 * params, 0, params
    if _get(cfg, "model.ctr") is not None:
        dim = int(_get(cfg, "model.ctr.embedding_dim", 16))
        fields = int(_get(cfg, "data.synthetic.num_fields", 8))
        vocab = int(_get(cfg, "data.synthetic.vocabulary_per_field", 10000))
        s = float(_get(cfg, "data.synthetic.zipf_exponent", 1.1))
        weights = [(v + 1) ** -s for v in range(vocab)]
        total = sum(weights)
        # E[distinct values of one field in a batch] = sum_v 1 - (1 - p_v)^b.
        unique = fields * sum(1 - (1 - w / total) ** batch for w in weights)
        row = 8 + 4 * dim
        dense = 4 * (dim + 1)
        return "ctr", unique * row + dense, unique * row + dense, unique, int(unique) * dim
    raise SystemExit("ps_advise: the config has neither model.mlp nor model.ctr")


def step_bytes(config, sets):
    """(push bytes, pull bytes) of one worker step of config with --set overrides `sets`."""
    cfg = apply_sets(parse_textproto(read_text(config)), sets)
    _, pull_b, push_b, _, _ = model_bytes(cfg, int(_get(cfg, "training.batch_size", 64)))
    return push_b, pull_b
