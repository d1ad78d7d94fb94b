#!/usr/bin/python3
"""Fashion-MNIST with an unchanged PyTorch MLP whose parameters all live on the servers.

    bazel build //python:ps //server:ps_server
    /usr/bin/python3 python/examples/fashion_mnist_mlp.py            # 2 servers + 2 workers

Without --servers it starts the job's servers on free ports of 127.0.0.1 and one process per
worker (itself, with --worker_index and --servers); each worker trains on its half of the
training set. A step: pull every parameter (straight into the tensors), forward and backward
in PyTorch, push every gradient (the servers' Adam applies them), clock. Worker 0 evaluates
on the test set after each epoch and prints "final test accuracy A" at the end.
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


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def evaluate(model, x, y):
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def train(args):
    torch.set_num_threads(1)
    # The servers were started with cluster.num_workers = --workers (run_job); so is the client.
    workers = [] if args.workers is None else ["cluster.num_workers=%d" % args.workers]
    client = ps.Client(args.config, servers=args.servers.split(","), worker_index=args.worker_index,
                       overrides=workers)
    data = ps.load_data(args.config)
    x, y = data["train"]["x"], data["train"]["y"].astype(np.int64)
    mine = np.arange(args.worker_index, len(y), client.num_workers)  # this worker's shard
    model = Mlp()
    params = ps.torch.DenseParameters(client, model)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(args.seed + args.worker_index)
    start, samples = time.time(), 0
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(mine)
        for b in range(0, len(order), args.batch_size):
            idx = order[b:b + args.batch_size]
            params.pull()
            loss = loss_fn(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
            loss.backward()
            params.push()
            client.clock()
            samples += len(idx)
        if args.worker_index == 0:
            params.pull()
            acc = evaluate(model, data["test"]["x"], data["test"]["y"])
            print("worker 0  epoch %d  test accuracy %.4f  (%.1f s)" % (epoch, acc, time.time() - start), flush=True)
    print("worker %d: %d samples in %.1f s (%.0f samples/s)" % (
        args.worker_index, samples, time.time() - start, samples / (time.time() - start)), flush=True)
    if args.worker_index == 0:
        params.pull()
        print("final test accuracy %.4f" % evaluate(model, data["test"]["x"], data["test"]["y"]), flush=True)
    client.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(HERE, "fashion_mnist_mlp.textproto"))
    ap.add_argument("--workers", type=int, help="workers to run (default: the config's cluster.num_workers)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--worker_index", type=int, help="run as this worker (set by the launcher)")
    ap.add_argument("--servers", help="host:port,... (set by the launcher)")
    args = ap.parse_args()
    if args.servers is not None and args.worker_index is None:
        # ps.Client has no default worker index: a second worker 0 would replace the first.
        ap.error("--servers needs --worker_index (0..workers-1; the launcher sets both)")
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
