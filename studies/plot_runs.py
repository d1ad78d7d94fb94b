#!/usr/bin/python3
"""Plots training runs from their JSON-lines logs (training.log_path / ps_worker --log_path).

    /usr/bin/python3 studies/plot_runs.py docs/runs/centralized.jsonl docs/runs/async.jsonl \
        docs/runs/bsp.jsonl --out docs/fashion_mnist_runs.png

One figure with four panels: test metric (accuracy, or AUC for CTR) against wall time and
against training samples, training loss against wall time, and throughput per worker. Each
input file is one run (a distributed run's workers all write to the same file; lines carry
"worker"). Needs Debian's python3-matplotlib (`apt-get install python3-matplotlib`).
"""

import argparse
import collections
import json
import os
import sys


def load(path):
    evals, throughput = [], collections.defaultdict(list)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit("plot_runs: %s:%d: not JSON: %s" % (path, n, e))
            if d.get("type") == "eval":
                evals.append(d)
            elif d.get("type") == "throughput":
                throughput[d.get("worker", 0)].append(d)
    return evals, throughput


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="JSON-lines logs, one per run")
    ap.add_argument("--labels", help="comma-separated run names (default: file names)")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_runs: needs python3-matplotlib (apt-get install python3-matplotlib)")
    labels = args.labels.split(",") if args.labels else [
        os.path.splitext(os.path.basename(p))[0] for p in args.logs]
    if len(labels) != len(args.logs):
        sys.exit("plot_runs: %d labels for %d logs" % (len(labels), len(args.logs)))

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    for path, label in zip(args.logs, labels):
        evals, throughput = load(path)
        if evals:
            metric = "auc" if "auc" in evals[0] else "accuracy"
            ax[0][0].plot([e["time_s"] for e in evals], [e[metric] for e in evals], "o-", label=label)
            # A distributed run's "samples" are one worker's; scale to the whole job by the
            # number of workers that logged throughput.
            workers = max(1, len(throughput))
            ax[0][1].plot([e["samples"] * workers for e in evals], [e[metric] for e in evals], "o-",
                          label=label)
            ax[0][0].set_ylabel("test " + metric)
            ax[0][1].set_ylabel("test " + metric)
        for worker, points in sorted(throughput.items()):
            name = label if len(throughput) == 1 else "%s w%s" % (label, worker)
            ax[1][0].plot([p["time_s"] for p in points], [p["loss"] for p in points], label=name)
            ax[1][1].plot([p["time_s"] for p in points], [p["samples_per_s"] for p in points], label=name)
    ax[0][0].set_xlabel("wall time (s)")
    ax[0][1].set_xlabel("training samples (all workers)")
    ax[1][0].set_xlabel("wall time (s)")
    ax[1][0].set_ylabel("training loss (moving average)")
    ax[1][1].set_xlabel("wall time (s)")
    ax[1][1].set_ylabel("samples/s (per worker, running average)")
    for a in ax.flat:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print("plot_runs: wrote %s" % args.out)


if __name__ == "__main__":
    main()
