#!/usr/bin/env python3
"""Local SGD against asynchronous and bulk-synchronous training, on one machine.

    python3 studies/local_sgd_study.py [--epochs 5] [--config CONFIG] [--json out.jsonl]

Runs the 2-server, 2-worker Fashion-MNIST job (tools/launch_local.py) once per mode:
asynchronous, BSP, and local SGD merging every k = 1, 4 and 16 steps (model averaging
under BSP: each worker's delta is added / num_workers). Prints a markdown table of the final
test accuracy, the time until worker 0's test accuracy first reached --target, the bytes the workers sent and received (summed), the job's
samples/s (every worker's samples over the time from the first start of training to the last
end, evaluation left out: job_runs.job_rate) and wall time. Build first: bazel build //server:ps_server //worker:ps_worker
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
from job_runs import job_rate, parse_run, read_logs, worker_log_flag  # noqa: E402

MODES = [
    ("async", ""),
    ("BSP", "training.staleness=0"),
    ("local SGD k=1", "training.staleness=0,training.local_sgd.steps=1"),
    ("local SGD k=4", "training.staleness=0,training.local_sgd.steps=4"),
    ("local SGD k=16", "training.staleness=0,training.local_sgd.steps=16"),
]


def time_to(records, target):
    """Seconds until worker 0 first evaluated at >= target test accuracy (None if never), from
    the workers' JSON-log "eval" records."""
    for rec in records:
        if rec.get("type") == "eval" and rec.get("worker") == 0 and rec.get("accuracy", 0) >= target:
            return float(rec["time_s"])
    return None


def run(config, sets, log_dir):
    """One tools/launch_local.py job whose workers log to log_dir; (launcher output, records)."""
    cmd = [sys.executable, "tools/launch_local.py", config, "--set", sets, worker_log_flag(log_dir)]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("local_sgd_study: %s failed:\n%s" % (" ".join(cmd), p.stdout[-3000:]))
    return p.stdout, read_logs(log_dir)


def run_row(mode, epochs, target, out, records):
    """One mode's row from its launcher output and the workers' records. Its samples/s is the
    job's (job_rate), not the sum of each worker's own rate, which counts stretches where one
    worker trains alone (the other evaluating, or not started yet) as if both did; older logs
    without starts give the summary's rate."""
    r = parse_run(out, records)
    rate = job_rate(records)
    return dict(mode=mode, epochs=epochs, target=target, seconds_to_target=time_to(records, target),
                samples_per_s=r["samples_per_s"] if rate is None else rate,
                accuracy=r["final_metric"], bytes_sent=r["bytes_sent"],
                bytes_received=r["bytes_received"])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--config", default="configs/fashion_mnist_2x2_async.textproto")
    ap.add_argument("--modes", default=",".join(m for m, _ in MODES),
                    help="comma-separated subset of: " + ", ".join(m for m, _ in MODES))
    ap.add_argument("--json", default=None, help="append one JSON line per run here")
    ap.add_argument("--target", type=float, default=0.88,
                    help="report the time until worker 0's test accuracy first reaches this")
    args = ap.parse_args()
    wanted = args.modes.split(",")
    rows = []
    for name, overrides in MODES:
        if name not in wanted:
            continue
        sets = ",".join(x for x in ["training.epochs=%d" % args.epochs, overrides] if x)
        start = time.time()
        log_dir = tempfile.mkdtemp(prefix="ps-local-sgd-")
        try:
            out, records = run(args.config, sets, log_dir)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
        row = run_row(name, args.epochs, args.target, out, records)
        row["wall_s"] = round(time.time() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    print("\n| mode | test accuracy | s to %.2f | MB sent by workers | MB received | samples/s (job) | wall s |"
          % args.target)
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %s | %.1f | %.1f | %.0f | %.1f |" % (
            r["mode"], "%.4f" % r["accuracy"] if r["accuracy"] is not None else "-",
            "%.1f" % r["seconds_to_target"] if r["seconds_to_target"] is not None else "never",
            r["bytes_sent"] / 1e6, r["bytes_received"] / 1e6, r["samples_per_s"], r["wall_s"]))


if __name__ == "__main__":
    main()
