"""Runs a job with the launchers and reads what its processes report: the one module the
studies (studies/crossover_study.py, studies/local_sgd_study.py, studies/scaling_bench.py) and
the advisor (tools/ps_advise.py) share.

launch_argv builds a tools/launch_ssh.py command line whose workers each write their JSON-lines
log (ps_worker --log_path; records "throughput", "eval", "done") into the run's log dir;
read_logs reads those logs back, summarize turns them into the run's measured values, and
parse_run adds what only the launcher's output holds (the bytes each worker's store sent and
received, the bash `times` CPU lines of the wrapped binaries). run_until runs a job until worker
0's test metric reaches a target.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def cpu_seconds(text):
    """bash `times` children line "0m7.740s 0m0.560s" -> 8.3."""
    total = 0.0
    for m, s in re.findall(r"(\d+)m([0-9.]+)s", text):
        total += int(m) * 60 + float(s)
    return total


def worker_log_flag(log_dir):
    """The launcher flag giving every worker its own JSON-lines log in log_dir (the launchers
    replace {index} in --worker_arg with the worker's index)."""
    return "--worker_arg=--log_path=" + os.path.join(log_dir, "worker-{index}.jsonl")


def read_log(path):
    """One JSON-lines log -> its records (dicts); a line that is not JSON raises ValueError
    naming the file and line."""
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                raise ValueError("%s line %d: not JSON: %r" % (path, n, line[:80]))
    return records


def read_logs(log_dir):
    """The records of every worker-*.jsonl in log_dir (worker_log_flag's files), in file order."""
    records = []
    for path in sorted(glob.glob(os.path.join(log_dir, "worker-*.jsonl"))):
        records += read_log(path)
    return records


def summarize(records):
    """Workers' JSON-log records -> the measured values of a run: per worker its "done" record
    (steps, samples, wall_s, samples_per_s, pull_s, compute_s, push_s); the last "eval" record's
    accuracy or auc as the final metric."""
    r = dict(samples_per_s=0.0, worker_rates=[], pull_s=0.0, compute_s=0.0, push_s=0.0, steps=0, samples=0,
             train_s=0.0, final_metric=None)
    for rec in records:
        if rec.get("type") == "done":
            r["worker_rates"].append(float(rec["samples_per_s"]))
            r["steps"] += int(rec["steps"])
            r["samples"] += int(rec["samples"])
            r["train_s"] = max(r["train_s"], float(rec["wall_s"]))
            for key in ("pull_s", "compute_s", "push_s"):
                r[key] += float(rec[key])
        elif rec.get("type") == "eval":
            r["final_metric"] = rec.get("accuracy", rec.get("auc"))
    # The cluster's rate: every worker's samples over the longest worker's training time
    # (summing per-worker rates would count a worker that finishes early as still running).
    r["sum_of_worker_rates"] = sum(r["worker_rates"])
    r["samples_per_s"] = r["samples"] / r["train_s"] if r["train_s"] else r["sum_of_worker_rates"]
    return r


def job_rate(records):
    """Workers' "done" records -> every worker's samples over the time from the first start of
    training to the last end of it (evaluation, last, left out); None without starts."""
    done = [r for r in records if r.get("type") == "done"]
    if not done or any("start_unix_s" not in r or "eval_s" not in r for r in done):
        return None
    start = min(r["start_unix_s"] for r in done)
    end = max(r["start_unix_s"] + r["wall_s"] - r["eval_s"] for r in done)
    return sum(r["samples"] for r in done) / (end - start) if end > start else None


def parse_run(out, records):
    """A run's measured values: summarize(records) (the workers' JSON logs) plus, from the
    launcher's output `out`, the bytes the workers' stores sent and received and the CPU seconds
    of each wrapped process (neither is in the JSON log)."""
    r = summarize(records)
    r.update(bytes_sent=0, bytes_received=0, cpu_s={})
    for line in out.splitlines():
        who = re.match(r"^\[(server|worker) (\d+)@[^\]]*\] (.*)$", line)
        name, text = (("%s %s" % who.group(1, 2)), who.group(3)) if who else ("worker 0", line)
        m = re.search(r"sent (\d+) bytes, received (\d+) bytes", text)
        if m:
            r["bytes_sent"] += int(m.group(1))
            r["bytes_received"] += int(m.group(2))
        # bash `times`: the wrapper's own line, then its child's; the last one counts.
        if re.fullmatch(r"\d+m[0-9.]+s \d+m[0-9.]+s", text.strip()):
            r["cpu_s"][name] = round(cpu_seconds(text), 3)
    r["cpu_total_s"] = round(sum(r["cpu_s"].values()), 3)
    return r


def eval_record(rec):
    """(epoch, test metric, seconds) of a JSON-log "eval" record (accuracy or AUC), else None."""
    if rec.get("type") != "eval":
        return None
    metric = rec.get("accuracy", rec.get("auc"))
    return None if metric is None else (int(rec["epoch"]), float(metric), float(rec["time_s"]))


def run_until(argv, target, limit, log_path):
    """Runs argv (in its own process group) until worker 0's JSON log (log_path) holds an
    evaluation reaching target (then SIGTERM to the group) or limit seconds pass (the same).

    Returns ([(epoch, metric, seconds)], the first one reaching target or None, output, wall s,
    whether it failed: exited non-zero before reaching the target or the limit)."""
    start = time.time()
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()

    def stop():
        try:
            os.killpg(p.pid, signal.SIGTERM)  # a launcher stops every process it started
        except ProcessLookupError:
            pass

    timed_out = []
    timer = threading.Timer(limit, lambda: (timed_out.append(True), stop()))
    timer.start()
    try:
        evals, reached = follow_evals(p, log_path, target, stop)
    finally:
        timer.cancel()
        try:
            p.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        reader.join(timeout=10)
        p.stdout.close()
    failed = reached is None and not timed_out and p.returncode != 0
    return evals, reached, "".join(lines), time.time() - start, failed


def follow_evals(p, log_path, target, stop):
    """Reads the evaluations appended to log_path while p runs; calls stop() at the first one
    reaching target. Returns (evaluations up to it, it or None)."""
    evals, reached, f, partial, exited = [], None, None, "", False
    try:
        while reached is None:
            if f is None and os.path.exists(log_path):
                f = open(log_path)
            chunk = f.readline() if f is not None else ""
            if not chunk:
                if exited:
                    break
                if p.poll() is not None:
                    exited = True  # read what it wrote last, then stop
                    continue
                try:
                    p.wait(timeout=0.2)  # the process's exit or the next line, whichever first
                except subprocess.TimeoutExpired:
                    pass
                continue
            partial += chunk
            if not partial.endswith("\n"):
                continue  # the rest of the line is still being written
            line, partial = partial, ""
            e = eval_record(json.loads(line)) if line.strip() else None
            if e is not None:
                evals.append(e)
                if e[1] >= target:
                    reached = e
                    stop()
    finally:
        if f is not None:
            f.close()
    return evals, reached


def launch_argv(host_lines, config, sets, bin_dir, run_dir, exec_template, eval_mode):
    """The tools/launch_ssh.py command line of a job measured for throughput: its hosts file
    (written to run_dir) from host_lines, config with the --set overrides `sets`, no
    checkpoints, workers evaluating per eval_mode (never, auto, always), each writing its JSON
    log to run_dir/logs (read_logs)."""
    os.makedirs(run_dir, exist_ok=True)
    hosts = os.path.join(run_dir, "hosts")
    with open(hosts, "w") as f:
        f.write("".join(line + "\n" for line in host_lines))
    return [sys.executable, os.path.join(ROOT, "tools/launch_ssh.py"), hosts, config, "--exec", exec_template,
            "--bin_dir", bin_dir, "--remote_dir", run_dir, "--log_dir", os.path.join(run_dir, "logs"),
            "--set", ",".join(list(sets) + ["checkpoint.on_shutdown=false", "checkpoint.interval_s=0"]),
            "--worker_arg=--eval=" + eval_mode, "--worker_arg=--wait_for_servers_s=60",
            worker_log_flag(os.path.join(run_dir, "logs"))]
