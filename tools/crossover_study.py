#!/usr/bin/env python3
"""When does distribution pay? Centralized against 1-4 workers on 1-2 servers, per link speed.

    python3 tools/crossover_study.py --out docs/runs/crossover.jsonl          # as root for netns links
    /usr/bin/python3 tools/crossover_study.py --report docs/runs/crossover.jsonl \
        --plot docs/crossover.png                                             # table + plot only

Models (--models): small = MLP 784-64-10 (50.9k parameters, batch 64); large = MLP
784-2048-2048-10 (5.8M parameters, batch 256); ctr = the synthetic CTR model with 100k values
per field and 32-wide embeddings (800k possible rows, batch 256). Each runs for a fixed number
of steps per worker (training.max_steps, per model and link below), no evaluation, so every
run takes seconds.

Links (--links): `loopback` runs every process on this machine's 127.0.0.1 (launch_ssh.py
with an empty --exec); every other link is a rate for tc tbf (e.g. 10gbit, 1gbit, 100mbit;
`unshaped` = veths with no qdisc): each server and worker is its own host, a network
namespace (tools/netns.py), started through launch_ssh.py --exec "ip netns exec {host}".
Per link the study first probes it (TCP ping-pong and a 32 MB stream, tools/ps_advise.py),
then runs each model centralized (one process, no network; repeated per link, which shows
the run-to-run noise) and on every --cells SERVERSxWORKERS, asynchronous, plus --extra_modes
(BSP, local SGD) on --extra_cells.

Every process runs under a wrapper that reports its CPU time (user + system), so the table
can show how much of the machine a run used: all "hosts" share this machine's cores.

Output: one JSON line per run (--out): samples/s summed over workers, wall time, bytes the
workers sent and received, the workers' pull/compute/push breakdown, CPU seconds per
process, the link probe. --report prints the markdown tables; --plot draws samples/s
against link speed per model (needs matplotlib: Debian's /usr/bin/python3 with
python3-matplotlib). Namespaces, qdiscs and processes are removed however the study ends.
Build first: bazel build //server:ps_server //worker:ps_worker //tools:ps_bench
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

MNIST = "configs/fashion_mnist_2x2_async.textproto"
CTR = "configs/ctr_synthetic_2x2.textproto"
MODELS = {
    "small": (MNIST, ["model.mlp.hidden=64"]),
    "large": (MNIST, ["model.mlp.hidden=2048,2048", "training.batch_size=256"]),
    "ctr": (CTR, ["data.synthetic.vocabulary_per_field=100000", "data.synthetic.num_train=200000",
                  "model.ctr.embedding_dim=32"]),
}
# Steps per worker, by model and link class: about 3-10 s per run on a 2-core machine.
STEPS = {
    "small": {"fast": 1500, "1gbit": 1000, "slow": 200},
    "large": {"fast": 20, "1gbit": 8, "slow": 3},
    "ctr": {"fast": 600, "1gbit": 600, "slow": 200},
}
EXTRA_MODES = {
    "BSP": ["training.staleness=0"],
    "lsgd4": ["training.staleness=0", "training.local_sgd.steps=4"],
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


def cpu_seconds(text):
    """bash `times` children line "0m7.740s 0m0.560s" -> 8.3."""
    total = 0.0
    for m, s in re.findall(r"(\d+)m([0-9.]+)s", text):
        total += int(m) * 60 + float(s)
    return total


def parse_run(out):
    """Launcher / worker output -> the measured values of one run."""
    r = dict(samples_per_s=0.0, worker_rates=[], bytes_sent=0, bytes_received=0, cpu_s={},
             pull_s=0.0, compute_s=0.0, push_s=0.0, steps=0, samples=0, train_s=0.0)
    for line in out.splitlines():
        who = re.match(r"^\[(server|worker) (\d+)@[^\]]*\] (.*)$", line)
        name, text = (("%s %s" % who.group(1, 2)), who.group(3)) if who else ("worker 0", line)
        m = re.search(r"samples/s ([0-9.]+) wall_s", text)
        if m:
            r["worker_rates"].append(float(m.group(1)))
        m = re.search(r"sent (\d+) bytes, received (\d+) bytes", text)
        if m:
            r["bytes_sent"] += int(m.group(1))
            r["bytes_received"] += int(m.group(2))
        m = re.search(r"(\d+) steps, \d+ samples in .*; pull ([0-9.]+)(m?s), compute ([0-9.]+)(m?s), "
                      r"push ([0-9.]+)(m?s)", text)
        if m:
            r["steps"] += int(m.group(1))
            for key, v, unit in (("pull_s", 2, 3), ("compute_s", 4, 5), ("push_s", 6, 7)):
                r[key] += float(m.group(v)) / (1e3 if m.group(unit) == "ms" else 1)
        m = re.search(r"\d+ steps, (\d+) samples in ([0-9.]+)(m?s) ", text)
        if m:
            r["samples"] += int(m.group(1))
            r["train_s"] = max(r["train_s"], float(m.group(2)) / (1e3 if m.group(3) == "ms" else 1))
        # bash `times`: the wrapper's own line, then its child's; the last one counts.
        if re.fullmatch(r"\d+m[0-9.]+s \d+m[0-9.]+s", text.strip()):
            r["cpu_s"][name] = round(cpu_seconds(text), 3)
    # The cluster's rate: every worker's samples over the longest worker's training time
    # (summing per-worker rates would count a worker that finishes early as still running).
    r["sum_of_worker_rates"] = sum(r["worker_rates"])
    r["samples_per_s"] = r["samples"] / r["train_s"] if r["train_s"] else r["sum_of_worker_rates"]
    r["cpu_total_s"] = round(sum(r["cpu_s"].values()), 3)
    return r


class Study:
    def __init__(self, args, bin_dir):
        self.args = args
        self.bin_dir = bin_dir
        self.work = tempfile.mkdtemp(prefix="ps-crossover-")
        self.wrapped = make_wrappers(args.bin_dir, os.path.join(self.work, "bin"))
        self.net = None

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

    def centralized(self, link, model, steps):
        config, sets = MODELS[model]
        threads = 1
        argv = [os.path.join(self.wrapped, "worker/ps_worker"), "--config=" + config, "--centralized",
                "--eval=never", "--threads=%d" % threads,
                "--set=" + ",".join(sets + ["training.max_steps=%d" % steps, "training.epochs=1000"])]
        code, out, wall = self.run(argv, 300)
        if code != 0:
            log("centralized %s failed (%s):\n%s" % (model, code, out[-2000:]))
            return
        self.record(dict(link=link, model=model, mode="centralized", servers=0, workers=1, steps_per_worker=steps,
                         wall_s=round(wall, 2), **parse_run(out)))

    def cluster(self, link, model, s, w, mode, steps):
        config, sets = MODELS[model]
        sets = sets + EXTRA_MODES.get(mode, []) + ["training.max_steps=%d" % steps, "training.epochs=1000"]
        hosts = os.path.join(self.work, "hosts")
        with open(hosts, "w") as f:
            for role, entries, count in (("server", SERVERS, s), ("worker", WORKERS, w)):
                for host, octet in entries[:count]:
                    if link == "loopback":
                        f.write("%s 127.0.0.1%s\n" % (role, " port=0" if role == "server" else ""))
                    else:
                        f.write("%s %s addr=%s.%d%s\n" % (role, self.net.ns(host), SUBNET, octet,
                                                         " port=7000" if role == "server" else ""))
        run_dir = os.path.join(self.work, "run-%d" % int(time.time() * 1000))
        argv = [sys.executable, os.path.join(ROOT, "tools/launch_ssh.py"), hosts, os.path.join(ROOT, config),
                "--exec", "" if link == "loopback" else "ip netns exec {host}", "--bin_dir", self.wrapped,
                "--remote_dir", run_dir, "--log_dir", os.path.join(run_dir, "logs"),
                "--set", ",".join(sets + ["checkpoint.on_shutdown=false", "checkpoint.interval_s=0"]),
                "--worker_arg=--eval=never", "--worker_arg=--wait_for_servers_s=60"]
        code, out, wall = self.run(argv, self.args.run_timeout)
        shutil.rmtree(run_dir, ignore_errors=True)
        if code != 0:
            log("%s %dx%d %s on %s failed (%s):\n%s" % (model, s, w, mode, link, code, out[-3000:]))
            if self.net:
                self.net.kill_processes()
            return
        self.record(dict(link=link, model=model, mode=mode, servers=s, workers=w, steps_per_worker=steps,
                         wall_s=round(wall, 2), **parse_run(out)))

    def probe(self, link):
        from ps_advise import probe_link
        if link == "loopback":
            return probe_link([], [], "127.0.0.1")
        return probe_link(self.net.exec_prefix("s0"), self.net.exec_prefix("w0"), "%s.%d" % (SUBNET, 1))

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
        for model in self.args.models.split(","):
            steps = max(1, int(STEPS[model][link_class(link)] * self.args.steps_scale))
            self.centralized(link, model, steps)
            for cell in self.args.cells.split(","):
                s, w = (int(x) for x in cell.split("x"))
                self.cluster(link, model, s, w, "async", steps)
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
    return [json.loads(l) for l in open(path) if l.strip()]


def report(rows, cores):
    """Markdown: per model, samples/s per cell (rows) and link (columns), and vs centralized."""
    links = []
    for r in rows:
        if r["link"] not in links:
            links.append(r["link"])
    out = []
    for model in MODELS:
        mine = [r for r in rows if r.get("model") == model]
        if not mine:
            continue
        out.append("\n**%s** (samples/s: all workers' samples over the longest worker's training time; in brackets: vs centralized on the same link)\n" % model)
        out.append("| mode | servers x workers | " + " | ".join(links) + " |")
        out.append("|---|---|" + "---|" * len(links))
        keys = []
        for r in mine:
            k = (r["mode"], r["servers"], r["workers"])
            if k not in keys:
                keys.append(k)
        for k in keys:
            cells = []
            for l in links:
                base = [x for x in mine if x["link"] == l and x["mode"] == "centralized"]
                hit = [x for x in mine if x["link"] == l and (x["mode"], x["servers"], x["workers"]) == k]
                if not hit:
                    cells.append("-")
                    continue
                v = hit[-1]["samples_per_s"]
                cells.append("%.0f" % v if k[0] == "centralized" or not base else
                             "%.0f (%.2fx)" % (v, v / base[-1]["samples_per_s"]))
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
        out.append("\nLink probes (TCP, Python, worker host -> server host):\n")
        out.append("| link | stream MB/s | ping-pong rtt ms |")
        out.append("|---|---|---|")
        for p in probes:
            out.append("| %s | %.0f | %.3f |" % (p["link"], p["bandwidth_Bps"] / 1e6, p["rtt_s"] * 1e3))
    return "\n".join(out)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    links = []
    for r in rows:
        if r["link"] not in links and r["mode"] != "probe":
            links.append(r["link"])
    models = [m for m in MODELS if any(r.get("model") == m for r in rows)]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r.get("model") == model]
        keys = []
        for r in mine:
            k = (r["mode"], r["servers"], r["workers"])
            if k not in keys:
                keys.append(k)
        xs = list(range(len(links)))
        for k in keys:
            ys = []
            for l in links:
                hit = [x["samples_per_s"] for x in mine if x["link"] == l and (x["mode"], x["servers"], x["workers"]) == k]
                ys.append(hit[-1] if hit else float("nan"))
            label = "centralized" if k[0] == "centralized" else "%s %dx%d" % (k[0], k[1], k[2])
            ax.plot(xs, ys, marker="o", linestyle="--" if k[0] == "centralized" else "-",
                    linewidth=2.5 if k[0] == "centralized" else 1.2, color="black" if k[0] == "centralized" else None,
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="crossover.jsonl", help="append one JSON line per run here")
    ap.add_argument("--links", default="loopback,10gbit,1gbit,100mbit")
    ap.add_argument("--models", default="small,large,ctr")
    ap.add_argument("--cells", default="1x1,1x2,2x2,2x4", help="SERVERSxWORKERS, asynchronous")
    ap.add_argument("--extra_modes", default="BSP,lsgd4", help="also run these (BSP, lsgd4) ...")
    ap.add_argument("--extra_cells", default="2x2", help="... on these cells ...")
    ap.add_argument("--extra_models", default="large", help="... for these models")
    ap.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    ap.add_argument("--steps_scale", type=float, default=1.0, help="multiply every run's steps by this")
    ap.add_argument("--run_timeout", type=float, default=240, help="seconds one run may take")
    ap.add_argument("--report", default=None, help="only print the tables of this JSON-lines file")
    ap.add_argument("--plot", default=None, help="draw the crossover plot (PNG) from --out / --report")
    args = ap.parse_args()
    args.bin_dir = os.path.realpath(args.bin_dir)
    if args.report:
        rows = load(args.report)
        print(report(rows, os.cpu_count()))
        if args.plot:
            plot(rows, args.plot)
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
    rows = load(args.out)
    print(report(rows, os.cpu_count()))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
