"""Runs a job with the launchers and reads what its processes report: the shared part of the
studies (tools/crossover_study.py) and the advisor (tools/ps_advise.py).

launch_argv builds a tools/launch_ssh.py command line; parse_run reads the measured values of
one run from the launcher's output (the workers' summaries, bytes, CPU times); run_until runs a
job until worker 0's test metric reaches a target.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Worker 0's evaluation line, as the launchers prefix it or not.
EVAL_LINE = re.compile(r"worker 0  epoch (\d+)  test (?:accuracy|AUC) ([0-9.]+)  (?:loss|log-loss) [0-9.]+  \(([0-9.]+) s\)")


def cpu_seconds(text):
    """bash `times` children line "0m7.740s 0m0.560s" -> 8.3."""
    total = 0.0
    for m, s in re.findall(r"(\d+)m([0-9.]+)s", text):
        total += int(m) * 60 + float(s)
    return total


# An absl::Duration as glog prints it: "1h2m3.5s", "238.5ms", "12us", "0".
DURATION = r"(?:\d+(?:\.\d+)?(?:h|ms|us|ns|m|s))+|0"


def duration_s(text):
    """"1m7.25s" -> 67.25; "238.5ms" -> 0.2385; "0" -> 0."""
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    return sum(float(v) * scale[u] for v, u in re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", text))


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
        # "worker 0: 20 steps, 5120 samples in 1m2.5s (81 samples/s; data 1.2ms, pull 3.1s, compute ...)"
        m = re.search(r"(\d+) steps, (\d+) samples in (%s) \(.*\)" % DURATION, text)
        if m:
            r["steps"] += int(m.group(1))
            r["samples"] += int(m.group(2))
            r["train_s"] = max(r["train_s"], duration_s(m.group(3)))
            for key in ("pull", "compute", "push"):
                part = re.search(r"[(;,] %s (%s)[,)]" % (key, DURATION), m.group(0))
                if part:
                    r[key + "_s"] += duration_s(part.group(1))
        # bash `times`: the wrapper's own line, then its child's; the last one counts.
        if re.fullmatch(r"\d+m[0-9.]+s \d+m[0-9.]+s", text.strip()):
            r["cpu_s"][name] = round(cpu_seconds(text), 3)
    # The cluster's rate: every worker's samples over the longest worker's training time
    # (summing per-worker rates would count a worker that finishes early as still running).
    r["sum_of_worker_rates"] = sum(r["worker_rates"])
    r["samples_per_s"] = r["samples"] / r["train_s"] if r["train_s"] else r["sum_of_worker_rates"]
    r["cpu_total_s"] = round(sum(r["cpu_s"].values()), 3)
    return r


def run_until(argv, target, limit):
    """Runs argv (in its own process group), reading worker 0's evaluations from its output, until
    one reaches target (then SIGTERM to the group) or limit seconds pass (the same).

    Returns ([(epoch, metric, seconds)], the first one reaching target or None, output, wall s,
    whether it failed: exited non-zero before reaching the target or the limit)."""
    start = time.time()
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)

    def stop():
        try:
            os.killpg(p.pid, signal.SIGTERM)  # a launcher stops every process it started
        except ProcessLookupError:
            pass

    evals, reached, lines, timed_out = [], None, [], []
    timer = threading.Timer(limit, lambda: (timed_out.append(True), stop()))
    timer.start()
    try:
        for line in p.stdout:
            lines.append(line)
            m = EVAL_LINE.search(line)
            if m and reached is None:
                e = (int(m.group(1)), float(m.group(2)), float(m.group(3)))
                evals.append(e)
                if e[1] >= target:
                    reached = e
                    stop()
    finally:
        timer.cancel()
        try:
            p.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.stdout.close()
    failed = reached is None and not timed_out and p.returncode != 0
    return evals, reached, "".join(lines), time.time() - start, failed


def launch_argv(host_lines, config, sets, bin_dir, run_dir, exec_template, eval_mode):
    """The tools/launch_ssh.py command line of a job measured for throughput: its hosts file
    (written to run_dir) from host_lines, config with the --set overrides `sets`, no
    checkpoints, workers evaluating per eval_mode (never, auto, always)."""
    os.makedirs(run_dir, exist_ok=True)
    hosts = os.path.join(run_dir, "hosts")
    with open(hosts, "w") as f:
        f.write("".join(line + "\n" for line in host_lines))
    return [sys.executable, os.path.join(ROOT, "tools/launch_ssh.py"), hosts, config, "--exec", exec_template,
            "--bin_dir", bin_dir, "--remote_dir", run_dir, "--log_dir", os.path.join(run_dir, "logs"),
            "--set", ",".join(list(sets) + ["checkpoint.on_shutdown=false", "checkpoint.interval_s=0"]),
            "--worker_arg=--eval=" + eval_mode, "--worker_arg=--wait_for_servers_s=60"]
