#!/usr/bin/env python3
"""Training throughput of centralized mode against 1, 2 and 4 workers on 1 and 2 servers.

    python3 studies/scaling_bench.py [--epochs 1] [--set training.prefetch=true] [--json F]

For each model (Fashion-MNIST MLP, synthetic CTR) it runs the job once in centralized mode
and once per (servers, workers) cell through tools/launch_local.py, all on this machine, and
prints a markdown table of samples/s, the final test metric and, for the worst worker, its
communication over its compute time, two ways:
  calls/compute:   the wall time of the store calls of its training steps (pull + push; with
                   training.prefetch the background calls, which overlap compute);
  exposed/compute: the time its steps spent on communication instead of computing (the calls
                   themselves without prefetch; with prefetch the staging copies and the time
                   blocked waiting for the background calls).
Without prefetch the two are equal. Logs of binaries older than the comm_s field give
(pull + push) / compute for both without prefetch; with prefetch their calls/compute is unknown
("-") and exposed is (pull + push + wait) / compute.
A run's samples/s is the job's: every worker's samples over the time from the first worker's
start of training to the last one's end (the workers' logs give each start and its evaluation
time). Every run evaluates only after its last epoch (training.eval_every_epochs=0), which is
left out, as centralized mode leaves its own out: evaluating after each epoch on worker 0 alone
put the workers out of step, and the sum of each worker's own rate, used before 2026-12-06,
counted the stretches where one trained alone as if both did. Logs without the start (older
binaries) give that sum.
Build first: bazel build //server:ps_server //worker:ps_worker
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from job_runs import job_rate, read_logs, summarize, worker_log_flag  # noqa: E402
MODELS = {
    "mlp": ("configs/fashion_mnist_2x2_async.textproto", "accuracy"),
    "ctr": ("configs/ctr_synthetic_2x2.textproto", "auc"),
}


def comm_ratios(done):
    """A worker's "done" record -> (store call time / compute or None if the log does not say,
    exposed communication / compute)."""
    compute = max(done["compute_s"], 1e-9)
    exposed = done["pull_s"] + done["push_s"] + done.get("wait_s", 0)
    if "comm_s" in done:
        return done["comm_s"] / compute, done["exposed_comm_s"] / compute
    # Older binaries: without prefetch pull and push are the calls themselves.
    return (None if done.get("prefetch") else exposed / compute), exposed / compute


def worst(a, b):
    return b if a is None else a if b is None else max(a, b)


def parse(records):
    """Workers' JSON-log records -> (the job's samples/s (job_rate; the sum of the workers'
    own rates without starts), the last test metric, the worst worker's calls/compute (None if
    unknown), the worst worker's exposed/compute (None without workers' records), each worker's
    time breakdown in seconds)."""
    r = summarize(records)
    comm = exposed = None
    times = []
    for rec in records:
        if rec.get("type") == "done":
            times.append({k: rec[k] for k in ("worker", "steps", "data_s", "pull_s", "compute_s", "push_s",
                                              "wait_s", "comm_s", "exposed_comm_s") if k in rec})
            calls, exp = comm_ratios(rec)
            comm = worst(comm, calls)
            exposed = worst(exposed, exp)
    rate = job_rate(records)
    return (r["sum_of_worker_rates"] if rate is None else rate), r["final_metric"], comm, exposed, times


def run(cmd, log_dir):
    """Runs cmd (its workers logging to log_dir); (records, wall seconds)."""
    start = time.time()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("scaling_bench: %s failed:\n%s" % (" ".join(cmd), p.stdout[-3000:]))
    return read_logs(log_dir), time.time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--models", default="mlp,ctr")
    ap.add_argument("--cells", default="1x1,1x2,1x4,2x1,2x2,2x4", help="SERVERSxWORKERS list")
    ap.add_argument("--set", default="", help="config overrides for every run, centralized "
                    "included (e.g. training.prefetch=true)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bin_dir", default=None,
                    help="where server/ps_server and worker/ps_worker are (default: bazel-bin)")
    args = ap.parse_args()
    bin_dir = args.bin_dir or os.path.join(ROOT, "bazel-bin")
    worker = os.path.join(bin_dir, "worker/ps_worker")
    rows = []
    for model in args.models.split(","):
        config, metric_name = MODELS[model]
        common = "training.epochs=%d,training.eval_every_epochs=0" % args.epochs + (
            "," + args.set if args.set else "")
        log_dir = tempfile.mkdtemp(prefix="ps-scaling-")
        records, wall = run([worker, "--config=" + config, "--centralized", "--set=" + common,
                             "--log_path=" + os.path.join(log_dir, "worker-0.jsonl")], log_dir)
        shutil.rmtree(log_dir, ignore_errors=True)
        rate, metric, _, _, times = parse(records)
        rows.append(dict(model=model, mode="centralized", servers=0, workers=1, samples_per_s=rate,
                         metric=metric, wall_s=wall, comm=None, exposed=None, times=times))
        print(rows[-1], flush=True)
        for cell in args.cells.split(","):
            s, w = (int(x) for x in cell.split("x"))
            log_dir = tempfile.mkdtemp(prefix="ps-scaling-")
            records, wall = run([sys.executable, "tools/launch_local.py", config, "--servers", str(s),
                                 "--workers", str(w), "--bin_dir", bin_dir, "--set", common,
                                 worker_log_flag(log_dir)], log_dir)
            shutil.rmtree(log_dir, ignore_errors=True)
            rate, metric, comm, exposed, times = parse(records)
            rows.append(dict(model=model, mode="distributed", servers=s, workers=w, samples_per_s=rate,
                             metric=metric, wall_s=wall, comm=comm, exposed=exposed, times=times))
            print(rows[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("\n| model | mode | servers | workers | samples/s (sum) | vs centralized | test metric | "
          "wall s | calls/compute, worst worker | exposed/compute, worst worker |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = {r["model"]: r["samples_per_s"] for r in rows if r["mode"] == "centralized"}
    for r in rows:
        ratio = r["samples_per_s"] / base[r["model"]] if base.get(r["model"]) else 0
        comm = ["%.2f" % v if v is not None else "-" for v in (r["comm"], r["exposed"])]
        print("| %s | %s | %s | %d | %.0f | %.2fx | %s | %.1f | %s | %s |" % (
            r["model"], r["mode"], r["servers"] or "-", r["workers"], r["samples_per_s"], ratio,
            "%.4f" % r["metric"] if r["metric"] is not None else "-", r["wall_s"], comm[0], comm[1]))


if __name__ == "__main__":
    main()
