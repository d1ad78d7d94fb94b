#!/usr/bin/env python3
"""Summarizes a run_checks.sh results folder: the 1 server + 1 GPU worker target.

    python3 tools/gpu/summarize.py OUT_DIR

For every round of the centralized GPU run (mlp_centralized_cuda_R) and every 1 + 1 variant
run in the same round (mlp_1x1_cuda[_VARIANT]_R), one line: samples/s, the ratio to that
round's centralized run (the target is >= 0.7), the worker's time per step (compute, wait,
pull, push), whether its gradients were lent, the server's time in its tables per call, how
much longer the worker's compute took a step than the centralized run's, and the exposed
communication per step (pull + push + wait: what the step spent on the store instead of
computing) that 0.7x would allow the run, its other time as it was ("none" when it is over
with none at all).
Then each variant's median ratio over the rounds, and the tables_benchmark lines if any.
Reads only the files; runs nothing. Works with the Python 3 of the GPU machine (no imports
beyond the standard library).
"""

import json
import os
import re
import statistics
import sys

CENTRALIZED = re.compile(r"^mlp_centralized_cuda_(\d+)\.jsonl$")
ONE_ONE = re.compile(r"^mlp_1x1_cuda(?:_(.+?))?_(\d+)\.jsonl$")
TABLES = re.compile(
    r"time in the tables: (\d+) pushes, check ([\d.]+) us \+ apply ([\d.]+) us each; "
    r"(\d+) pulls, read ([\d.]+) us each")
TARGET = 0.7


def done_record(path):
    """The worker's "done" record of a jsonl log, or None."""
    done = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("type") == "done":
                done = record
    return done


def tables_line(path):
    """(check us, apply us, read us) from a server log's stop line, or None."""
    if not os.path.exists(path):
        return None
    found = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = TABLES.search(line)
            if m:
                found = (float(m.group(2)), float(m.group(3)), float(m.group(5)))
    return found


def per_step_ms(done, key):
    steps = done.get("steps") or 0
    return 1e3 * done.get(key, 0.0) / steps if steps else 0.0


def training_s(done):
    """Seconds of training (evaluation excluded) of a done record."""
    rate = done.get("samples_per_s") or 0.0
    return done.get("samples", 0) / rate if rate else 0.0


def collect(out_dir):
    """{round: done record} of the centralized runs and [(variant, round, done, tables)]."""
    centralized = {}
    runs = []
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        m = CENTRALIZED.match(name)
        if m:
            done = done_record(path)
            if done:
                centralized[int(m.group(1))] = done
            continue
        m = ONE_ONE.match(name)
        if m:
            done = done_record(path)
            if done is None:
                continue
            variant = m.group(1) or "as built"
            server_log = os.path.join(out_dir, name[:-len(".jsonl")] + "_server.log")
            runs.append((variant, int(m.group(2)), done, tables_line(server_log)))
    return centralized, runs


def summarize(out_dir):
    """The summary's lines."""
    centralized, runs = collect(out_dir)
    lines = ["variant round: samples/s (ratio to the round's centralized), per step: compute "
             "/ wait / pull / push ms; lent; server per call: check + apply / read us; the "
             "compute's excess over centralized; exposed communication and what 0.7x allows, "
             "ms per step"]
    for r in sorted(centralized):
        c = centralized[r]
        lines.append(f"centralized {r}: {c['samples_per_s']:,.0f} samples/s, compute "
                     f"{per_step_ms(c, 'compute_s'):.3f} ms per step")
    ratios = {}
    for variant, r, done, tables in sorted(runs, key=lambda x: (x[0], x[1])):
        base = centralized.get(r)
        ratio = done["samples_per_s"] / base["samples_per_s"] if base else None
        if ratio is not None:
            ratios.setdefault(variant, []).append(ratio)
        parts = [f"{variant} {r}: {done['samples_per_s']:,.0f} samples/s"]
        parts[0] += f" ({ratio:.2f})" if ratio is not None else " (no centralized run)"
        parts.append("{:.3f} / {:.3f} / {:.3f} / {:.3f} ms".format(
            per_step_ms(done, "compute_s"), per_step_ms(done, "wait_s"),
            per_step_ms(done, "pull_s"), per_step_ms(done, "push_s")))
        parts.append("lent" if done.get("lent_gradients") else "not lent")
        if tables:
            parts.append(f"server {tables[0]:.0f} + {tables[1]:.0f} / {tables[2]:.0f} us")
        steps = done.get("steps") or 0
        if base and steps and base.get("steps"):
            excess = per_step_ms(done, "compute_s") - per_step_ms(base, "compute_s")
            parts.append(f"compute {excess:+.3f}")
            exposed = done.get("exposed_comm_s")
            if exposed is None:
                exposed = sum(done.get(k, 0.0) for k in ("pull_s", "push_s", "wait_s"))
            # Training time at 0.7x of the centralized rate, less this run's but its exposed
            # communication.
            allowed_ms = 1e3 * (training_s(base) / TARGET - (training_s(done) - exposed)) / steps
            parts.append(f"exposed {1e3 * exposed / steps:.3f}, " +
                         (f"allowed {allowed_ms:.3f}" if allowed_ms >= 0 else
                          f"allowed none ({-allowed_ms:.3f} over)"))
        lines.append("; ".join(parts))
    for variant in sorted(ratios):
        values = ratios[variant]
        median = statistics.median(values)
        verdict = "met" if median >= TARGET else "not met"
        lines.append(f"median {variant}: {median:.2f} ({min(values):.2f}-{max(values):.2f}, "
                     f"{len(values)} rounds) vs >= {TARGET}: {verdict}")
    bench = os.path.join(out_dir, "tables_benchmark.log")
    if os.path.exists(bench):
        with open(bench, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("BM_"):
                    lines.append("tables: " + " ".join(line.split()[:4]))
    return lines


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print("usage: summarize.py OUT_DIR (a run_checks.sh results folder)", file=sys.stderr)
        return 2
    for line in summarize(argv[1]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
