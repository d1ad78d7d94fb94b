#!/usr/bin/python3
"""The Python client's overhead: the same calls as ps_bench's C++ client, on the same servers.

    bazel build //python:ps //server:ps_server //bench:ps_bench
    /usr/bin/python3 python/bench_client.py [--seconds 2] [--rounds 3] [--json out.jsonl]

Starts 2 ps_server processes with ps_bench's tables (ps_bench --write_config), then, for
--rounds rounds, alternately runs ps_bench --connect (1 client, dense push and pull of 1 MB,
sparse pulls of 10,000 uniform keys from 1,000,000 rows of 16 floats) and the same loops from
Python (pull_dense into a preallocated array, push_dense of a float32 array, pull_sparse of
pre-drawn key arrays into a preallocated array). Prints each operation's median over the
rounds, C++ and Python, and their ratio.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ps  # noqa: E402
import ps.cluster  # noqa: E402

DENSE = "bench/dense_1MB"
SPARSE = "bench/sparse_dim16"
KEYS, KEY_SPACE, DIM = 10000, 1000000, 16


def timed_loop(fn, seconds, warmup):
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        fn()
    calls, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        fn()
        calls += 1
        now = time.perf_counter()
        if now >= end:
            return calls / (now - start)


def python_round(client, seconds, warmup, key_sets):
    out = np.empty(DENSE_FLOATS, np.float32)
    grad = np.full(DENSE_FLOATS, 1e-6, np.float32)
    rows = np.empty((KEYS, DIM), np.float32)
    mb = DENSE_FLOATS * 4 / float(1 << 20)  # MB as ps_bench counts them
    it = [0]

    def sparse_pull():
        client.pull_sparse(SPARSE, key_sets[it[0] % len(key_sets)], out=rows)
        it[0] += 1

    return {
        ("dense", "push"): timed_loop(lambda: client.push_dense(DENSE, grad), seconds, warmup) * mb,
        ("dense", "pull"): timed_loop(lambda: client.pull_dense(DENSE, out=out), seconds, warmup) * mb,
        ("sparse", "pull"): timed_loop(sparse_pull, seconds, warmup) * KEYS,
    }


def cpp_round(bench, addresses, config, seconds, warmup):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        subprocess.run([bench, "--connect=" + ",".join(addresses), "--config=" + config, "--modes=dense,sparse",
                        "--payloads=1MB", "--clients=1", "--dense_ops=push,pull", "--sparse_ops=pull",
                        "--sparse_keys=%d" % KEYS, "--key_space=%d" % KEY_SPACE, "--sparse_dim=%d" % DIM,
                        "--sparse_prefill=false", "--seconds=%g" % seconds, "--warmup=%g" % warmup,
                        "--json=" + f.name], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = {}
        for line in open(f.name):
            r = json.loads(line)
            key = ("sparse", "pull") if r["rows_per_call"] > 0 else ("dense", r["op"])
            out[key] = r["rows_per_s"] if key[0] == "sparse" else r["mb_per_s"]
        return out


DENSE_FLOATS = 262144


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the medians and ratios as JSON lines here")
    args = ap.parse_args()
    bench = ps.cluster.find_binary("bench/ps_bench")
    root = tempfile.mkdtemp(prefix="ps-pybench-")
    config = os.path.join(root, "bench.textproto")
    subprocess.run([bench, "--write_config=" + config, "--servers=2", "--payloads=1MB",
                    "--sparse_dim=%d" % DIM], check=True, stdout=subprocess.DEVNULL)
    with ps.cluster.LocalServers(config, num_servers=2) as servers:
        client = ps.Client(config, servers=servers.addresses, worker_index=1)
        rng = np.random.default_rng(1)
        # Touch every row once, so that row creation is not measured (as ps_bench's prefill).
        for start in range(0, KEY_SPACE, 100000):
            client.pull_sparse(SPARSE, np.arange(start, start + 100000, dtype=np.uint64))
        key_sets = [rng.integers(0, KEY_SPACE, KEYS, dtype=np.uint64) for _ in range(32)]
        results = {"cpp": [], "python": []}
        for _ in range(args.rounds):
            results["cpp"].append(cpp_round(bench, servers.addresses, config, args.seconds, args.warmup))
            results["python"].append(python_round(client, args.seconds, args.warmup, key_sets))
        client.close()
    shutil.rmtree(root, ignore_errors=True)
    rows = []
    print("%-14s %14s %14s %8s" % ("operation", "C++ ps_bench", "Python", "ratio"))
    for key in [("dense", "push"), ("dense", "pull"), ("sparse", "pull")]:
        cpp = statistics.median(r[key] for r in results["cpp"])
        py = statistics.median(r[key] for r in results["python"])
        unit = "rows/s" if key[0] == "sparse" else "MB/s"
        label = "%s %s" % key + (" 1MB" if key[0] == "dense" else " 10k")
        print("%-14s %9.0f %-4s %9.0f %-4s %8.2f" % (label, cpp, unit, py, unit, py / cpp))
        rows.append({"op": label, "unit": unit, "cpp": cpp, "python": py, "ratio": py / cpp,
                     "rounds": args.rounds, "seconds": args.seconds})
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
