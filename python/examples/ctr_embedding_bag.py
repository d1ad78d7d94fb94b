#!/usr/bin/python3
"""Synthetic CTR with a PyTorch model: an embedding bag whose table lives on the servers, and a
small MLP on the pooled embedding (its parameters on the servers too).

    bazel build //python:ps //server:ps_server
    /usr/bin/python3 python/examples/ctr_embedding_bag.py            # 2 servers + 2 workers
    /usr/bin/python3 python/examples/ctr_embedding_bag.py --plain    # same model, plain PyTorch

The data is the C++ CTR model's (configs/ctr_synthetic_2x2.textproto's synthetic section),
made by the same generator (ps.load_data), so the test AUC compares directly with ps_worker's
and with the generator's ground truth, which this prints next to it. A step: pull the batch's
unique embedding rows and the MLP's parameters, forward and backward in PyTorch, push the row
gradients (EmbeddingBag's backward) and the MLP's gradients, clock. --plain trains the same
model in one process with torch.nn.EmbeddingBag and torch.optim.Adagrad (no servers), for the
samples/s comparison.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import ps  # noqa: E402
import ps.cluster  # noqa: E402
import ps.torch  # noqa: E402


class CtrModel(nn.Module):
    """logit = out(pooled) + fc2(relu(fc1(pooled))), pooled = the sum of the example's rows."""

    def __init__(self, embedding, dim=8, hidden=16):
        super().__init__()
        self.emb = embedding
        self.out, self.fc1, self.fc2 = nn.Linear(dim, 1), nn.Linear(dim, hidden), nn.Linear(hidden, 1)

    def forward(self, keys, offsets):
        pooled = self.emb(keys, offsets)
        return (self.out(pooled) + self.fc2(torch.relu(self.fc1(pooled)))).squeeze(1)


def fields(d):
    """The ids as an (examples, fields) array (every synthetic example has one id per field)."""
    per = np.diff(d["offsets"])
    assert (per == per[0]).all(), "expected the same number of ids in every example"
    return d["ids"].reshape(len(per), per[0])


def batches(ids, order, batch_size):
    f = ids.shape[1]
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        yield idx, ids[idx].ravel(), np.arange(0, len(idx) * f, f)


def test_auc(model, ids, y, key_map=None):
    scores = []
    with torch.no_grad():
        for _, keys, offsets in batches(ids, np.arange(len(y)), 4096):
            if key_map:
                keys, offsets = key_map(keys), torch.from_numpy(offsets)
            scores.append(torch.sigmoid(model(keys, offsets)).numpy())
    return ps.auc(np.concatenate(scores), y)


def train(args):
    torch.set_num_threads(1)
    # The servers were started with cluster.num_workers = --workers (run_job); so is the client.
    workers = [] if args.workers is None else ["cluster.num_workers=%d" % args.workers]
    client = ps.Client(args.config, servers=args.servers.split(","), worker_index=args.worker_index,
                       overrides=workers)
    data = ps.load_data(args.config)
    ids, y = fields(data["train"]), data["train"]["y"]
    model = CtrModel(ps.torch.EmbeddingBag(client, "ctr/embedding", mode="sum"))
    params = ps.torch.DenseParameters(client, model)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(args.seed + args.worker_index)
    mine = np.arange(args.worker_index, len(y), client.num_workers)
    start, samples = time.time(), 0
    for epoch in range(1, args.epochs + 1):
        for idx, keys, offsets in batches(ids, rng.permutation(mine), args.batch_size):
            params.pull()
            loss = loss_fn(model(keys, offsets), torch.from_numpy(y[idx]))
            loss.backward()  # pushes the embedding rows' gradients
            params.push()
            client.clock()
            samples += len(idx)
        print("worker %d  epoch %d done  (%.1f s)" % (args.worker_index, epoch, time.time() - start), flush=True)
    wall = time.time() - start
    print("worker %d: %d samples in %.1f s (%.0f samples/s)" % (args.worker_index, samples, wall, samples / wall),
          flush=True)
    if args.worker_index == 0:
        params.pull()
        auc = test_auc(model, fields(data["test"]), data["test"]["y"])
        print("final test auc %.4f ground_truth_auc %.4f" % (auc, data["ground_truth_auc"]), flush=True)
    client.close()


def plain(args):
    """The same model in one process: nn.EmbeddingBag over the ids' dense indices, Adagrad."""
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    data = ps.load_data(args.config)
    ids, y = fields(data["train"]), data["train"]["y"]
    vocab = np.unique(np.concatenate([data["train"]["ids"], data["test"]["ids"]]))

    def key_map(keys):
        return torch.from_numpy(np.searchsorted(vocab, keys).astype(np.int64))

    emb = nn.EmbeddingBag(len(vocab), 8, mode="sum")
    nn.init.normal_(emb.weight, 0, 0.01)
    model = CtrModel(emb)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1, initial_accumulator_value=0.1)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(args.seed)
    start, samples = time.time(), 0
    for epoch in range(1, args.epochs + 1):
        for idx, keys, offsets in batches(ids, rng.permutation(len(y)), args.batch_size):
            opt.zero_grad()
            loss = loss_fn(model(key_map(keys), torch.from_numpy(offsets)), torch.from_numpy(y[idx]))
            loss.backward()
            opt.step()
            samples += len(idx)
        print("plain  epoch %d done  (%.1f s)" % (epoch, time.time() - start), flush=True)
    wall = time.time() - start
    print("plain PyTorch: %d samples in %.1f s (%.0f samples/s)" % (samples, wall, samples / wall), flush=True)
    auc = test_auc(model, fields(data["test"]), data["test"]["y"], key_map)
    print("final test auc %.4f ground_truth_auc %.4f" % (auc, data["ground_truth_auc"]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(HERE, "ctr_embedding_bag.textproto"))
    ap.add_argument("--workers", type=int, help="workers to run (default: the config's cluster.num_workers)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plain", action="store_true", help="train in one process with plain PyTorch")
    ap.add_argument("--worker_index", type=int, help="run as this worker (set by the launcher)")
    ap.add_argument("--servers", help="host:port,... (set by the launcher)")
    args = ap.parse_args()
    if args.servers is not None and args.worker_index is None:
        # ps.Client has no default worker index: a second worker 0 would replace the first.
        ap.error("--servers needs --worker_index (0..workers-1; the launcher sets both)")
    if args.plain:
        return plain(args)
    if args.servers is not None:
        return train(args)
    argv = [sys.executable, os.path.abspath(__file__), "--config", args.config, "--epochs", str(args.epochs),
            "--batch_size", str(args.batch_size), "--seed", str(args.seed)]
    if args.workers is not None:
        argv += ["--workers", str(args.workers)]
    codes = ps.cluster.run_job(args.config, argv, num_workers=args.workers)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
