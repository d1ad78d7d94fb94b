#!/usr/bin/env python3
"""When does distribution pay? Centralized against 1-4 workers on 1-2 servers, per link speed.

    python3 studies/crossover_study.py --out crossover.jsonl          # as root for netns links
    /usr/bin/python3 studies/crossover_study.py --report crossover.jsonl \
        --plot crossover.png                                             # table + plot only

Models (--models): small = MLP 784-64-10 (50.9k parameters, batch 64); large = MLP
784-2048-2048-10 (5.8M parameters, batch 256); ctr = the synthetic CTR model with 100k values
per field and 32-wide embeddings (800k possible rows, batch 256). Each runs for a fixed number
of steps per worker (training.max_steps, per model and link below), no evaluation, so every
run takes seconds.

Links (--links): `loopback` runs every process on this machine's 127.0.0.1 (launch_ssh.py
with an empty --exec); every other link is a rate for tc tbf (e.g. 10gbit, 1gbit, 100mbit;
`unshaped` = veths with no qdisc): each server and worker is its own host, a network
namespace (tools/netns.py), started through launch_ssh.py --exec "ip netns exec {host}".
Per link the study first probes it (TCP ping-pong, a 32 MB stream, and each model's step: its
push bytes out and pull bytes back, tools/ps_advise.py),
then runs each model centralized (one process, no network, one BLAS thread as every worker
has; repeated per link, which shows the run-to-run noise), centralized with a BLAS thread per
core (mode centralized-all-cores: what one process can do on this machine, where a cluster's
processes share its cores), and on every --cells SERVERSxWORKERS, asynchronous, plus --extra_modes
(BSP, local SGD) on --extra_cells. On loopback the processes of a cluster pass calls and
payloads through shared memory, as on any one host; each model's 1x1 runs once more by the
socket there (mode async-socket), which is what the advisor measures a step by for links
between hosts. Shaped links always go by the socket.

Every process runs under a wrapper that reports its CPU time (user + system), so the table
can show how much of the machine a run used: all "hosts" share this machine's cores.

--target: time to a target test metric instead (TARGETS: accuracy 0.85 small, 0.84 large, AUC
0.82 ctr). Per link and model, the cells of TARGET_CELLS train with worker 0 evaluating after
each of its epochs, until an evaluation reaches the target (then the run is stopped) or the
model's time limit passes (TARGET_LIMITS; recorded as not reached, with the best metric seen).
The time is worker 0's training clock, evaluations included: what a user waits for.
    python3 studies/crossover_study.py --target --links 10gbit,1gbit,100mbit --out crossover_target.jsonl
    /usr/bin/python3 studies/crossover_study.py --report crossover_target.jsonl \
        --target_plot crossover_target.png

Output: one JSON line per run (--out): samples/s summed over workers, wall time, bytes the
workers sent and received, the workers' pull/compute/push breakdown, CPU seconds per
process, the link probe. --report prints the markdown tables; --plot draws samples/s
against link speed per model (needs matplotlib: Debian's /usr/bin/python3 with
python3-matplotlib). Namespaces, qdiscs and processes are removed however the study ends.
Build first: bazel build //server:ps_server //worker:ps_worker
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from job_runs import launch_argv, parse_run, read_log, read_logs, run_until  # noqa: E402
from link_probe import probe_link  # noqa: E402
from step_cost import step_bytes  # noqa: E402

MNIST = "configs/fashion_mnist_2x2_async.textproto"
CTR = "configs/ctr_synthetic_2x2.textproto"
MODELS = {
    "small": (MNIST, ["model.mlp.hidden=64"]),
    "large": (MNIST, ["model.mlp.hidden=2048,2048", "training.batch_size=256"]),
    "ctr": (CTR, ["data.synthetic.vocabulary_per_field=100000", "data.synthetic.num_train=200000",
                  "model.ctr.embedding_dim=32"]),
}
# Steps per worker, by model and link class (centralized runs, which use no link, always take
# the "fast" count): 1.3-6 s per run on loopback on a 2-core machine, up to 13 s at 10 Gbit/s
# and 30 s for the 4-worker runs over the slower links (the small model's and ctr's raised on 2026-12-06:
# with the data path of that day, the counts of 2026-11-30 trained for well under a second).
STEPS = {
    "small": {"fast": 6000, "1gbit": 4000, "slow": 400},
    "large": {"fast": 20, "1gbit": 8, "slow": 3},
    "ctr": {"fast": 2000, "1gbit": 1500, "slow": 200},
}
EXTRA_MODES = {
    "BSP": ["training.staleness=0"],
    "lsgd4": ["training.staleness=0", "training.local_sgd.steps=4"],
    # Asynchronous with calls and payloads by the socket although every process is on this
    # host: on loopback, each model's 1x1 also runs so, as the advisor's input for links
    # between hosts (studies/advise_validation.py), where there is no shared memory.
    "async-socket": ["rpc.shared_memory_mb=0"],
}
# Time-to-target runs (--target): per model, the test metric to reach (accuracy; AUC for ctr), and
# the longest a run may take (seconds) before it is recorded as not reaching it.
TARGETS = {"small": 0.85, "large": 0.84, "ctr": 0.82}
TARGET_LIMITS = {"small": 90, "large": 240, "ctr": 90}
# The cells of the time-to-target runs, per model: (mode, servers, workers).
TARGET_CELLS = {
    "small": [("centralized", 0, 1), ("centralized-all-cores", 0, 1), ("async", 1, 2), ("async", 2, 4)],
    "large": [("centralized", 0, 1), ("centralized-all-cores", 0, 1), ("async", 2, 2), ("BSP", 2, 2),
              ("lsgd4", 2, 2)],
    "ctr": [("centralized", 0, 1), ("centralized-all-cores", 0, 1), ("async", 1, 2), ("async", 2, 4)],
}
SERVERS = [("s0", 1), ("s1", 2)]
WORKERS = [("w%d" % i, 11 + i) for i in range(4)]
TAG = "px"
PREFIX = "pxstudy"
SUBNET = "10.78.0"

WRAPPER = """#!/bin/bash
# Runs %(real)s and reports its CPU time when it exits; forwards SIGTERM/SIGINT.
"%(real)s" "$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM
trap 'kill -INT $child 2>/dev/null' INT
wait $child; rc=$?
while kill -0 $child 2>/dev/null; do wait $child; rc=$?; done
echo "cpu_times of this wrapper, then of its child:"
times
exit $rc
"""


def log(msg):
    sys.stdout.write("[crossover] %s\n" % msg)
    sys.stdout.flush()


def link_class(link):
    if link in ("loopback", "unshaped"):
        return "fast"
    from netns import rate_bits
    bits = rate_bits(link)
    return "fast" if bits >= 5e9 else "1gbit" if bits >= 5e8 else "slow"


def make_wrappers(bin_dir, tmp):
    """A bin dir whose server/ps_server and worker/ps_worker wrap the real ones."""
    for role in ("server", "worker"):
        os.makedirs(os.path.join(tmp, role), exist_ok=True)
        path = os.path.join(tmp, role, "ps_" + role)
        with open(path, "w") as f:
            f.write(WRAPPER % {"real": os.path.join(bin_dir, role, "ps_" + role)})
        os.chmod(path, 0o755)
    return tmp


def parse_pairs(text, kind):
    """"small=0.85,ctr=0.8" -> {"small": 0.85, "ctr": 0.8}."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        if key not in MODELS or not value:
            sys.exit("crossover_study: %r: expected MODEL=VALUE with MODEL one of %s" % (item, ", ".join(MODELS)))
        out[key] = kind(value)
    return out


class Study:
    def __init__(self, args, bin_dir):
        self.args = args
        self.bin_dir = bin_dir
        self.targets = dict(TARGETS, **parse_pairs(args.target_metrics, float))
        self.target_limits = dict(TARGET_LIMITS, **parse_pairs(args.target_limits, float))
        self.net = None
        self.work = tempfile.mkdtemp(prefix="ps-crossover-")  # removed by close()
        self.wrapped = make_wrappers(args.bin_dir, os.path.join(self.work, "bin"))

    def record(self, row):
        row["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        log(json.dumps(row))
        with open(self.args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    def run(self, argv, timeout):
        start = time.time()
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)  # the launcher stops every process it started
            out, _ = p.communicate(timeout=90)
            return None, out, time.time() - start
        return p.returncode, out, time.time() - start

    def centralized(self, link, model, steps, threads=1):
        """One process; `threads` BLAS threads (0 = every core: mode centralized-all-cores)."""
        config, sets = MODELS[model]
        log_path = os.path.join(self.work, "centralized-%d.jsonl" % int(time.time() * 1000))
        argv = [os.path.join(self.wrapped, "worker/ps_worker"), "--config=" + config, "--centralized",
                "--eval=never", "--threads=%d" % threads, "--log_path=" + log_path,
                "--set=" + ",".join(sets + ["training.max_steps=%d" % steps, "training.epochs=1000"])]
        code, out, wall = self.run(argv, 300)
        records = read_log(log_path) if os.path.exists(log_path) else []
        if os.path.exists(log_path):
            os.unlink(log_path)
        if code != 0:
            log("centralized %s failed (%s):\n%s" % (model, code, out[-2000:]))
            return
        mode = "centralized" if threads == 1 else "centralized-all-cores"
        self.record(dict(link=link, model=model, mode=mode, servers=0, workers=1, steps_per_worker=steps,
                         wall_s=round(wall, 2), **parse_run(out, records)))

    def cluster_argv(self, link, model, s, w, mode, sets, run_dir, eval_mode):
        """launch_ssh.py command line for s servers and w workers of `model` on `link`."""
        config, model_sets = MODELS[model]
        lines = []
        for role, entries, count in (("server", SERVERS, s), ("worker", WORKERS, w)):
            for host, octet in entries[:count]:
                if link == "loopback":
                    lines.append("%s 127.0.0.1%s" % (role, " port=0" if role == "server" else ""))
                else:
                    lines.append("%s %s addr=%s.%d%s" % (role, self.net.ns(host), SUBNET, octet,
                                                        " port=7000" if role == "server" else ""))
        if link != "loopback":
            # Namespaces share one kernel: payloads would skip the shaped links through shared
            # memory.
            sets = sets + ["rpc.shared_memory_mb=0"]
        return launch_argv(lines, os.path.join(ROOT, config), model_sets + EXTRA_MODES.get(mode, []) + sets,
                           self.wrapped, run_dir, "" if link == "loopback" else "ip netns exec {host}", eval_mode)

    def cluster(self, link, model, s, w, mode, steps):
        run_dir = os.path.join(self.work, "run-%d" % int(time.time() * 1000))
        argv = self.cluster_argv(link, model, s, w, mode, ["training.max_steps=%d" % steps, "training.epochs=1000"],
                                 run_dir, "never")
        code, out, wall = self.run(argv, self.args.run_timeout)
        records = read_logs(os.path.join(run_dir, "logs")) if code == 0 else []
        shutil.rmtree(run_dir, ignore_errors=True)
        if code != 0:
            log("%s %dx%d %s on %s failed (%s):\n%s" % (model, s, w, mode, link, code, out[-3000:]))
            if self.net:
                self.net.kill_processes()
            return
        self.record(dict(link=link, model=model, mode=mode, servers=s, workers=w, steps_per_worker=steps,
                         wall_s=round(wall, 2), **parse_run(out, records)))

    def to_target(self, link, model, mode, s, w):
        """Trains until worker 0's test metric reaches the model's target, or the time limit.

        Worker 0 evaluates after each of its epochs (in a cluster of W workers, one epoch of
        worker 0 is about one pass over the data by all of them); the run is stopped as soon
        as an evaluation reaches the target. The time is worker 0's own clock since it started
        training, evaluations included."""
        config, model_sets = MODELS[model]
        target = self.targets[model]
        limit = self.target_limits[model]
        sets = ["training.epochs=%d" % self.args.target_epochs, "training.target_metric=%g" % target,
                "training.eval_every_epochs=1"]
        run_dir = os.path.join(self.work, "run-%d" % int(time.time() * 1000))
        worker0_log = os.path.join(run_dir, "logs", "worker-0.jsonl")  # launch_argv's name for it
        if mode.startswith("centralized"):
            os.makedirs(os.path.dirname(worker0_log), exist_ok=True)
            argv = [os.path.join(self.wrapped, "worker/ps_worker"), "--config=" + config, "--centralized",
                    "--eval=always", "--threads=%d" % (1 if mode == "centralized" else 0), "--log_path=" + worker0_log,
                    "--set=" + ",".join(model_sets + sets)]
        else:
            argv = self.cluster_argv(link, model, s, w, mode, sets, run_dir, "auto")
        evals, reached, out, wall, failed = run_until(argv, target, limit, worker0_log)
        shutil.rmtree(run_dir, ignore_errors=True)
        if self.net:
            self.net.kill_processes()
        if failed:
            log("%s %s %dx%d on %s failed:\n%s" % (model, mode, s, w, link, out[-3000:]))
            return
        if not evals and reached is None:
            log("%s %s %dx%d on %s: no evaluation within %.0f s:\n%s" % (model, mode, s, w, link, limit, out[-3000:]))
        self.record(dict(link=link, model=model, mode=mode, servers=s, workers=w, kind="target", target=target,
                         limit_s=limit, seconds_to_target=reached[2] if reached else None,
                         epochs_to_target=reached[0] if reached else None,
                         best_metric=max([e[1] for e in evals], default=None), evals=evals,
                         wall_s=round(wall, 2)))

    def probe(self, link):
        # Besides the rate and round trip: one worker step's pull and push, back to back, per model.
        exchanges = [step_bytes(self.bin_dir, os.path.join(ROOT, MODELS[m][0]), MODELS[m][1]) for m in self.args.models.split(",")]
        if link == "loopback":
            return probe_link([], [], "127.0.0.1", exchanges=exchanges)
        return probe_link(self.net.exec_prefix("s0"), self.net.exec_prefix("w0"), "%s.%d" % (SUBNET, 1),
                          exchanges=exchanges)

    def link(self, link):
        if link != "loopback":
            if self.net is None:
                from netns import Network
                Network.remove_stale(tag=TAG, prefix=PREFIX, log=log)
                self.net = Network(os.getpid(), SERVERS + WORKERS, tag=TAG, prefix=PREFIX, subnet=SUBNET, log=log)
                self.net.create("")
            self.net.shape("" if link == "unshaped" else link)
        probe = self.probe(link)
        self.record(dict(link=link, mode="probe", **probe))
        if self.args.target:
            for model in self.args.models.split(","):
                for mode, s, w in TARGET_CELLS[model]:
                    self.to_target(link, model, mode, s, w)
            return
        for model in self.args.models.split(","):
            steps = max(1, int(STEPS[model][link_class(link)] * self.args.steps_scale))
            # Centralized runs use no link: a slow link's few steps would only measure start-up.
            central_steps = max(1, int(STEPS[model]["fast"] * self.args.steps_scale))
            self.centralized(link, model, central_steps)
            self.centralized(link, model, central_steps, threads=0)
            for cell in self.args.cells.split(","):
                s, w = (int(x) for x in cell.split("x"))
                self.cluster(link, model, s, w, "async", steps)
            if link == "loopback":
                self.cluster(link, model, 1, 1, "async-socket", steps)
            if model in self.args.extra_models.split(","):
                for cell in self.args.extra_cells.split(","):
                    s, w = (int(x) for x in cell.split("x"))
                    for mode in self.args.extra_modes.split(","):
                        if mode:
                            self.cluster(link, model, s, w, mode, steps)

    def close(self):
        if self.net is not None:
            from netns import Network
            Network.remove(os.getpid(), tag=TAG, prefix=PREFIX)
        shutil.rmtree(self.work, ignore_errors=True)


# ---------------------------------------------------------------- report

def load(path):
    """The rows of a study's JSON-lines file; a line that is not JSON is named."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise ValueError("%s line %d: not JSON (%s)" % (path, n, e))
    return rows


def best_centralized(rows, link, key, better):
    """The `better` (max or min) of `key` over the centralized runs (one BLAS thread or one per
    core) of `link` in `rows`, each mode's last run as the cells show theirs (a file --out
    appended to holds several runs), None if there are none."""
    last = {r["mode"]: r for r in rows if r["link"] == link and r["mode"].startswith("centralized")}
    values = [r[key] for r in last.values() if r.get(key) is not None]
    return better(values) if values else None


def report(rows, cores):
    """Markdown: per model, samples/s per cell (rows) and link (columns), and vs centralized."""
    links, out = unique(r["link"] for r in rows), []
    for model in MODELS:
        mine = [r for r in rows if r.get("model") == model]
        if not mine:
            continue
        out.append("\n**%s** (samples/s: all workers' samples over the longest worker's training time; in brackets: "
                   "vs the faster centralized run on the same link, one BLAS thread or one per core)\n" % model)
        out.append("| mode | servers x workers | " + " | ".join(links) + " |")
        out.append("|---|---|" + "---|" * len(links))
        for k in unique(cell_key(r) for r in mine):
            cells = []
            for l in links:
                base = best_centralized(mine, l, "samples_per_s", max)
                hit = [x for x in mine if x["link"] == l and cell_key(x) == k]
                if not hit:
                    cells.append("-")
                    continue
                v = hit[-1]["samples_per_s"]
                cells.append("%.0f" % v if not base or v == base else "%.0f (%.2fx)" % (v, v / base))
            out.append("| %s | %s | %s |" % (k[0], "%dx%d" % (k[1], k[2]) if k[1] else "-", " | ".join(cells)))
    out.append("\nBytes and CPU (per step of one worker; CPU = all processes' user + system seconds "
               "over wall seconds, out of %d cores):\n" % cores)
    out.append("| model | link | mode | servers x workers | MB sent + received per worker step | "
               "pull / compute / push ms per step | CPU busy (cores) | samples per CPU second | "
               "busiest process: CPU s / training s | wall s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["mode"] == "probe":
            continue
        steps = max(1, r.get("steps") or r["steps_per_worker"] * r["workers"])
        mb = (r["bytes_sent"] + r["bytes_received"]) / steps / 1e6
        busy = r["cpu_total_s"] / r["wall_s"] if r.get("wall_s") else 0
        top = max(r["cpu_s"].values()) if r["cpu_s"] else 0
        out.append("| %s | %s | %s | %s | %s | %.1f / %.1f / %.1f | %.2f | %s | %.1f / %.1f | %.1f |" % (
            r["model"], r["link"], r["mode"], "%dx%d" % (r["servers"], r["workers"]) if r["servers"] else "-",
            "%.3f" % mb if r["servers"] else "-", r["pull_s"] / steps * 1e3, r["compute_s"] / steps * 1e3,
            r["push_s"] / steps * 1e3, busy, "%.0f" % (r["samples"] / r["cpu_total_s"]) if r["cpu_total_s"] else "-",
            top, r.get("train_s", 0), r["wall_s"]))
    probes = [r for r in rows if r["mode"] == "probe"]
    if probes:
        specs = unique(k for p in probes for k in p.get("exchange_s", {}))
        names = ["%s / %s MB step" % tuple("%.3f" % (int(v) / 1e6) for v in k.split("x")) for k in specs]
        out.append("\nLink probes (TCP, Python, worker host -> server host; a step: push bytes out, pull bytes "
                   "back, median ms):\n")
        out.append("| link | stream MB/s | ping-pong rtt ms |" + "".join(" %s |" % n for n in names))
        out.append("|---|---|---|" + "---|" * len(specs))
        for p in probes:
            ex = p.get("exchange_s", {})
            out.append("| %s | %.0f | %.3f |" % (p["link"], p["bandwidth_Bps"] / 1e6, p["rtt_s"] * 1e3) +
                       "".join(" %s |" % ("%.1f" % (ex[k] * 1e3) if k in ex else "-") for k in specs))
    return "\n".join(out)


def unique(items):
    """items without repeats, in their first order."""
    out = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def model_panels(rows):
    """A figure with a panel per model: (fig, links, [(axes, model, its rows, its cells)])."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    links = unique(r["link"] for r in rows if r["mode"] != "probe")
    models = [m for m in MODELS if any(r.get("model") == m for r in rows)]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    panels = []
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r.get("model") == model]
        panels.append((ax, model, mine, unique(cell_key(r) for r in mine)))
    return fig, links, panels


def cell_key(r):
    return (r["mode"], r["servers"], r["workers"])


def cell_name(k):
    return k[0] if k[0].startswith("centralized") else "%s %dx%d" % k


def target_report(rows):
    """Markdown: per model, seconds to the target per cell (rows) and link (columns)."""
    links, out = unique(r["link"] for r in rows), []
    for model in MODELS:
        mine = [r for r in rows if r.get("model") == model]
        if not mine:
            continue
        metric = "AUC" if model == "ctr" else "test accuracy"
        out.append("\n**%s**, seconds until worker 0's %s reached %g (epochs of worker 0 in brackets; "
                   "x: the faster centralized run's time over this one, above 1 = faster than it)\n"
                   % (model, metric, mine[0]["target"]))
        out.append("| mode | " + " | ".join(links) + " |")
        out.append("|---|" + "---|" * len(links))
        for k in unique(cell_key(r) for r in mine):
            cells = []
            for l in links:
                hit = [x for x in mine if x["link"] == l and cell_key(x) == k]
                base = best_centralized(mine, l, "seconds_to_target", min)
                if not hit:
                    cells.append("-")
                    continue
                r = hit[-1]
                if r["seconds_to_target"] is None:
                    cells.append("not in %.0f s (%s)" % (r["limit_s"], "best %.4f" % r["best_metric"] if r["best_metric"]
                                                         is not None else "worker 0 finished no epoch"))
                    continue
                text = "%.1f (%d)" % (r["seconds_to_target"], r["epochs_to_target"])
                if base and r["seconds_to_target"] != base:
                    text += " %.2fx" % (base / r["seconds_to_target"])
                cells.append(text)
            out.append("| %s | %s |" % (cell_name(k), " | ".join(cells)))
    return "\n".join(out)


def plot_target(rows, path):
    """Bars: seconds to the target per link, one group per link and a bar per cell (log scale);
    a run that did not reach it is drawn at its limit, hatched."""
    fig, links, panels = model_panels(rows)
    for ax, model, mine, keys in panels:
        width = 0.8 / len(keys)
        for i, k in enumerate(keys):
            for j, l in enumerate(links):
                hit = [x for x in mine if x["link"] == l and cell_key(x) == k]
                if not hit:
                    continue
                r = hit[-1]
                missed = r["seconds_to_target"] is None
                ax.bar(j + (i - (len(keys) - 1) / 2) * width, r["limit_s"] if missed else r["seconds_to_target"],
                       width, color="black" if k[0] == "centralized" else "C%d" % i, hatch="//" if missed else None,
                       alpha=0.35 if missed else 1.0, label=cell_name(k))
        ax.set_xticks(range(len(links)))
        ax.set_xticklabels(links)
        ax.set_yscale("log")
        ax.set_title("%s: seconds to %s %g" % (model, "AUC" if model == "ctr" else "accuracy", mine[0]["target"]))
        ax.set_xlabel("link (hatched: not reached within the limit)")
        ax.set_ylabel("seconds (lower is better)")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        seen = {}
        for h, lab in zip(handles, labels):
            seen.setdefault(lab, h)
        ax.legend(seen.values(), seen.keys(), fontsize=7)
    fig.suptitle("Time to a target test metric (all processes on one %d-core machine)" % os.cpu_count())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log("wrote " + path)


def plot(rows, path):
    fig, links, panels = model_panels(rows)
    for ax, model, mine, keys in panels:
        xs = list(range(len(links)))
        for k in keys:
            if k[0] == "async-socket":
                continue  # loopback only: the advisor's input, in the table
            ys = []
            for l in links:
                hit = [x["samples_per_s"] for x in mine if x["link"] == l and cell_key(x) == k]
                ys.append(hit[-1] if hit else float("nan"))
            label = cell_name(k)
            central = k[0].startswith("centralized")
            ax.plot(xs, ys, marker="o", linestyle="--" if central else "-",
                    linewidth=2.5 if central else 1.2,
                    color=("black" if k[0] == "centralized" else "grey") if central else None,
                    label=label)
        ax.set_xticks(xs)
        ax.set_xticklabels(links)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("link")
        ax.set_ylabel("samples/s (all workers)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Centralized vs servers x workers, per link (all processes on one %d-core machine)" % os.cpu_count())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log("wrote " + path)


def show(rows, args):
    """Prints the tables of a study's rows; draws the plots asked for."""
    fixed = [r for r in rows if r.get("kind") != "target"]
    target = [r for r in rows if r.get("kind") == "target"]
    if any(r["mode"] != "probe" for r in fixed):
        print(report(fixed, os.cpu_count()))
        if args.plot:
            plot(fixed, args.plot)
    if target:
        print(target_report(target))
        if args.target_plot:
            plot_target(target, args.target_plot)


def check_args(args):
    """Exits with the first bad argument named, before anything starts."""
    from netns import rate_bits
    for model in filter(None, (args.models + "," + args.extra_models).split(",")):
        if model not in MODELS:
            sys.exit("crossover_study: unknown model %r (one of %s)" % (model, ", ".join(MODELS)))
    for link in args.links.split(","):
        if link not in ("loopback", "unshaped"):
            try:
                rate_bits(link)
            except ValueError as e:
                sys.exit("crossover_study: --links: %s (or loopback, unshaped)" % e)
    for cell in filter(None, (args.cells + "," + args.extra_cells).split(",")):
        if not re.fullmatch(r"[1-9]\d*x[1-9]\d*", cell):
            sys.exit("crossover_study: cell %r: expected SERVERSxWORKERS, e.g. 2x4" % cell)
    for mode in filter(None, args.extra_modes.split(",")):
        if mode not in EXTRA_MODES:
            sys.exit("crossover_study: unknown mode %r (one of %s)" % (mode, ", ".join(EXTRA_MODES)))
    for flag, value in (("--target_metrics", args.target_metrics), ("--target_limits", args.target_limits)):
        try:
            parse_pairs(value, float)
        except ValueError as e:
            sys.exit("crossover_study: %s: %s" % (flag, e))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="crossover.jsonl", help="append one JSON line per run here")
    ap.add_argument("--links", default="loopback,10gbit,1gbit,100mbit")
    ap.add_argument("--models", default="small,large,ctr")
    ap.add_argument("--cells", default="1x1,1x2,2x2,2x4", help="SERVERSxWORKERS, asynchronous")
    ap.add_argument("--extra_modes", default="BSP,lsgd4", help="also run these (BSP, lsgd4, async-socket) ...")
    ap.add_argument("--extra_cells", default="2x2", help="... on these cells ...")
    ap.add_argument("--extra_models", default="large", help="... for these models")
    ap.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    ap.add_argument("--steps_scale", type=float, default=1.0, help="multiply every run's steps by this")
    ap.add_argument("--run_timeout", type=float, default=240, help="seconds one run may take")
    ap.add_argument("--target", action="store_true",
                    help="time-to-target runs instead of fixed-step ones: per link and model, the cells "
                         "of TARGET_CELLS train until worker 0's test metric reaches the target")
    ap.add_argument("--target_metrics", default="", help="override targets, e.g. small=0.85,large=0.84,ctr=0.82")
    ap.add_argument("--target_limits", default="", help="override the seconds limits, e.g. large=300")
    ap.add_argument("--target_epochs", type=int, default=30, help="most epochs of a time-to-target run")
    ap.add_argument("--report", default=None, help="only print the tables of this JSON-lines file")
    ap.add_argument("--plot", default=None, help="draw the crossover plot (PNG) from --out / --report")
    ap.add_argument("--target_plot", default=None, help="draw the time-to-target plot (PNG) from --out / --report")
    args = ap.parse_args()
    args.bin_dir = os.path.realpath(args.bin_dir)
    check_args(args)
    if args.report:
        show(load(args.report), args)
        return 0
    if any(l != "loopback" for l in args.links.split(",")):
        from netns import check_netns
        reason = check_netns()
        if reason:
            sys.exit("crossover_study: shaped links: %s (or use --links loopback)" % reason)
    study = Study(args, args.bin_dir)
    signal.signal(signal.SIGTERM, lambda s, _f: sys.exit("signal %d" % s))
    try:
        for link in args.links.split(","):
            study.link(link)
    finally:
        study.close()
    show(load(args.out), args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, KeyError) as e:  # unreadable or malformed result files
        sys.exit("crossover_study: %s" % e)
