#!/usr/bin/env python3
"""The data path's targets, measured in one session, as one markdown table.

    bazel build //bench:ps_bench //bench:ps_load //server:shard_benchmark \
        //server:ps_server //worker:ps_worker //bench:handoff_probe
    python3 studies/data_path_targets.py [--seconds 2] [--repeat 3] [--training] [--memory]

Runs, back to back on this machine:
  - ps_bench, 1 server + 1 client: raw TCP, dense 4 KB / 1 MB / 64 MB push and pull, sparse
    10k keys x 16 pull and push;
  - ps_bench, the same with 8 calls in flight at 4 KB;
  - ps_bench, 2 servers + 2 clients against 1 + 1, dense 1 MB and 64 MB, --repeat rounds of
    the two back to back (each round's ratio, the median round, and the cores each session
    kept busy: its clients' and servers' CPU per call times its calls per second);
    (all of them with payloads and calls through shared memory, as the config's defaults have
    them between processes of one host; --shared_memory_mb=0 sends them by the socket,
    --no_shared_memory_calls only the calls)
  - server/shard_benchmark's 64 MB Adam push, one thread against the parallel apply, alternated
    inside each iteration (the median ratio of --repeat repetitions);
  - with --memory, bench/ps_load (21 tables of 4M floats, Adam) and each server's peak RSS against
    its parameters and optimizer slots;
  - with --training, studies/scaling_bench.py's MLP rows (centralized, 1x1, 2x2), --repeat
    runs of --training_epochs epochs (the README job's 10 by default), each cell's ratio the
    median of the runs'.
and prints each target with its measured value, the ratio the target is stated in, and met or
not met. With bench/handoff_probe built, it also prints what handing 1 MB between two cores
cost the host before and after the run, with plain and with streamed stores: on a host whose
cores do not all share a cache, the plain figure moves with where the host runs the two, and
the 1 MB rows with it (docs/lab/2026-12-03-cross-core-handoff.md). Ratios come from one run of each reference (raw TCP in the same ps_bench process, but for
the 8-in-flight rows, whose 1-in-flight raw TCP is the first session's, run just before; the
1 + 1 figures of the same session; the centralized run of the same scaling_bench call).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Adam keeps two slots per parameter (first and second moments); the other optimizers fewer.
SLOTS = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def find(rows, mode, op, payload=None):
    """The one ps_bench row of mode/op (and payload); None if the run did not measure it."""
    for r in rows:
        if r["mode"] == mode and r["op"] == op and (payload is None or r["payload"] == payload):
            return r
    return None


def row(target, measured, ratio, goal, higher_is_better=True):
    """One line of the table; ratio None means the run did not produce the figure."""
    if ratio is None:
        met = "not measured"
    else:
        met = "met" if (ratio >= goal if higher_is_better else ratio <= goal) else "not met"
    return dict(target=target, measured=measured, ratio=ratio, goal=goal,
                higher_is_better=higher_is_better, met=met)


def transport_rows(one, window8):
    """Targets of the 1 + 1 session (one) and the 8-in-flight session (window8)."""
    out = []
    goals = {"4KB": 0.50, "1MB": 0.80, "64MB": 0.75}
    for payload, goal in goals.items():
        for op in ("push", "pull"):
            r = find(one, "grpc", op, payload)
            out.append(row("dense %s %s, 1 in flight, vs raw TCP" % (payload, op),
                           "%.0f MB/s" % r["mb_per_s"] if r else "-",
                           r and r["vs_tcp"], goal))
        push, pull = find(one, "grpc", "push", payload), find(one, "grpc", "pull", payload)
        slower = pull["mb_per_s"] / push["mb_per_s"] if push and pull and push["mb_per_s"] else None
        out.append(row("dense %s push time / pull time" % payload,
                       "push %.0f, pull %.0f MB/s" % (push["mb_per_s"], pull["mb_per_s"])
                       if slower else "-", slower, 1.2, higher_is_better=False))
    tcp = find(one, "tcp", "req_reply", "4KB")
    for op in ("push", "pull"):
        r = find(window8, "grpc", op, "4KB")
        ratio = r["calls_per_s"] / tcp["calls_per_s"] if r and tcp and tcp["calls_per_s"] else None
        out.append(row("dense 4KB %s, 8 in flight, vs raw TCP 1 in flight" % op,
                       "%.0f calls/s (raw %.0f)" % (r["calls_per_s"], tcp["calls_per_s"])
                       if ratio else "-", ratio, 1.0))
    for op in ("pull", "push"):
        r = find(one, "grpc", "sparse_" + op)
        rate = r and r["rows_per_s"]
        out.append(row("sparse 10k keys x 16 %s, rows/s" % op,
                       "%.2fM rows/s" % (rate / 1e6) if rate else "-",
                       rate / 5e6 if rate else None, 1.0))
    return out


def cores_busy(r):
    """How many cores a ps_bench row kept busy, clients and servers together: their CPU per call
    times the calls per second. None if the row has no CPU figures. A 1 + 1 row that already
    keeps every core busy leaves 2 + 2 no cores to scale onto: its figure can then only move
    with the CPU (and memory traffic) per byte."""
    if r.get("client_cpu_us_per_call") is None or r.get("server_cpu_us_per_call") is None:
        return None
    return (r["client_cpu_us_per_call"] + r["server_cpu_us_per_call"]) * r["calls_per_s"] / 1e6


def scaling_rows(rounds):
    """2 servers + 2 clients against 1 + 1, aggregate MB/s, at 1 MB and 64 MB. `rounds`: (1 + 1,
    2 + 2) sessions run back to back, round after round; each round's ratio compares the two
    sessions of that round, and the row is the median round (the host's load drifts over a
    run: a 1 + 1 figure measured minutes before the 2 + 2 one moves the ratio by itself)."""
    out = []
    for payload in ("1MB", "64MB"):
        for op in ("push", "pull"):
            measured = []  # (ratio, 2 + 2 MB/s, 1 + 1 MB/s, 2 + 2 cores, 1 + 1 cores)
            for one, two in rounds:
                a, b = find(one, "grpc", op, payload), find(two, "grpc", op, payload)
                if a and b and a["mb_per_s"]:
                    measured.append((b["mb_per_s"] / a["mb_per_s"], b["mb_per_s"], a["mb_per_s"],
                                     cores_busy(b), cores_busy(a)))
            name = "2+2 vs 1+1, dense %s %s, aggregate MB/s" % (payload, op)
            if not measured:
                out.append(row(name, "-", None, 1.5))
                continue
            mid = median(measured)
            text = "%.0f vs %.0f MB/s" % (mid[1], mid[2])
            if len(measured) > 1:
                text += " (median of %s)" % ", ".join("%.2f" % m[0] for m in measured)
            if mid[3] is not None and mid[4] is not None:
                text += "; cores busy %.2f vs %.2f of %d" % (mid[3], mid[4], os.cpu_count())
            out.append(row(name, text, mid[0], 1.5))
    return out


def adam_row(benchmarks):
    """shard_benchmark's JSON benchmarks -> the parallel apply's speedup over one thread.

    Prefers BM_PairAdamPush64MB (one thread and the parallel apply alternated inside each
    iteration, so load shifts hit both alike: the median of the per-iteration ratios, with the
    memory traffic each side moved, the Adam-shaped stream's own 1- vs 2-thread ratio over the
    same layout, and the push's ratio in the iterations where that stream ran >= 1.5x faster on
    two threads); otherwise the fastest repetition of BM_AdamPush64MB/0 (one thread) over /1
    (parallel). The text is that of the median repetition. What bounds the ratio is how much
    more than one thread's bandwidth two cores get from memory, which the stream shows
    (docs/lab/2026-12-03-stream-layout.md)."""
    name = "64 MB Adam apply, parallel vs 1 thread"
    iterations = [b for b in benchmarks if b.get("run_type", "iteration") == "iteration"]
    pairs = [b for b in iterations if b["name"].startswith("BM_PairAdamPush64MB")]
    if pairs:
        pairs.sort(key=lambda b: b["speedup"])
        p = pairs[len(pairs) // 2]
        text = "%.1f vs %.1f ms" % (p["ms_2"], p["ms_1"])
        if "GBps_1" in p and "GBps_2" in p:
            text += " (%.1f vs %.1f GB/s; the Adam-shaped stream's 2/1 %.2fx" % (
                p["GBps_2"], p["GBps_1"], p["ceiling"])
            if p.get("n_2c") and p.get("iterations"):
                text += "; %.2fx in the %d of %d iterations where the stream ran >= 1.5x" % (
                    p["speedup_2c"], p["n_2c"], p["iterations"])
            text += ")"
        return row(name, text, p["speedup"], 1.6)
    times = {}
    for b in iterations:
        m = re.match(r"BM_AdamPush64MB/(\d)", b["name"])
        if m:
            times.setdefault(m.group(1), []).append(b["real_time"])
    if "0" not in times or "1" not in times:
        return row(name, "-", None, 1.6)
    one, par = min(times["0"]), min(times["1"])
    return row(name, "%.1f vs %.1f ms" % (par, one), one / par, 1.6)


def memory_rows(text):
    """ps_load's report -> one row per server: peak RSS over parameters + optimizer slots."""
    m = re.search(r"tables x \d+ floats \((\w+)\)", text)
    slots = SLOTS.get(m.group(1).lower(), 0) if m else 0
    out = []
    for s, peak, params in re.findall(
            r"server (\d+): RSS \d+ MiB before, \d+ MiB after, peak (\d+) MiB "
            r"\(parameters only: (\d+) MiB", text):
        state = float(params) * (1 + slots)
        out.append(row("server %s memory under ps_load, peak RSS / (parameters + slots)" % s,
                       "%s MiB peak, %.0f MiB state" % (peak, state), float(peak) / state, 1.3,
                       higher_is_better=False))
    return out or [row("server memory under ps_load", "-", None, 1.3, higher_is_better=False)]


def median(values):
    """The middle value; tuples by their first element alone (the rest may hold None). Of an
    even count, the upper of the two middle ones (the default --repeat of 3 is odd)."""
    ordered = sorted(values, key=lambda v: v[0] if isinstance(v, tuple) else v)
    return ordered[len(ordered) // 2]


def training_rows(runs):
    """scaling_bench --json records of the MLP, one list per run: cells against centralized,
    and (pull+push)/compute, each the median over the runs (each run's ratio against its own
    centralized run; the runs' values are listed)."""
    out = []
    for cell, goal in (((1, 1), 0.6), ((2, 2), 0.8)):
        ratios, comms, exposed, rates = [], [], [], []
        for records in runs:
            base = next((r["samples_per_s"] for r in records if r["mode"] == "centralized"), None)
            r = next((r for r in records if (r["servers"], r["workers"]) == cell), None)
            if not r or not base:
                continue
            ratios.append(r["samples_per_s"] / base)
            rates.append((r["samples_per_s"], base))
            if r.get("comm") is not None:
                comms.append(r["comm"])
            # With training.prefetch the calls overlap compute: what the steps lost to them too.
            if r.get("exposed") is not None and r["exposed"] != r.get("comm"):
                exposed.append(r["exposed"])
        listed = lambda values: ", ".join("%.2f" % v for v in values)
        if ratios:
            mid = median(ratios)
            rate, base = rates[ratios.index(mid)]
            measured = "%.0f vs %.0f samples/s" % (rate, base)
            if len(ratios) > 1:
                measured += " (median of %s)" % listed(ratios)
        else:
            mid, measured = None, "-"
        out.append(row("training %d+%d vs centralized samples/s" % cell, measured, mid, goal))
        for name, values in (("(pull+push)/compute", comms),
                             ("exposed communication/compute", exposed)):
            if values:
                out.append(row("training %d+%d worst worker %s" % (cell + (name,)),
                               listed(values) if len(values) > 1 else "%.2f" % values[0],
                               median(values), 1.0, higher_is_better=False))
    return out


def table(rows):
    lines = ["| target | measured | ratio | goal | met |", "|---|---|---|---|---|"]
    for r in rows:
        goal = ("%s %.2f" % (">=" if r["higher_is_better"] else "<=", r["goal"]))
        ratio = "%.2f" % r["ratio"] if r["ratio"] is not None else "-"
        if r["ratio"] is not None and float(ratio) == r["goal"] and r["met"] != "met":
            ratio = "%.4f" % r["ratio"]  # a miss that rounds to the goal reads as one
        lines.append("| %s | %s | %s | %s | %s |" % (r["target"], r["measured"], ratio, goal, r["met"]))
    return "\n".join(lines)


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("data_path_targets: %s failed (%d):\n%s" % (cmd[0], p.returncode, p.stdout[-3000:]))
    return p.stdout


def ps_bench(args, tmp, name, extra):
    path = os.path.join(tmp, name + ".jsonl")
    run([os.path.join(args.bin_dir, "bench/ps_bench"), "--seconds=%g" % args.seconds,
         "--repeat=%d" % args.repeat, "--json=" + path,
         "--shared_memory_mb=%d" % args.shared_memory_mb,
         "--shared_memory_calls=%s" % str(not args.no_shared_memory_calls).lower()] + extra)
    return read_jsonl(path)


def measure(args, tmp):
    one = ps_bench(args, tmp, "one", ["--servers=1", "--clients=1", "--modes=tcp,dense,sparse",
                                      "--payloads=4KB,1MB,64MB", "--sparse_keys=10000"])
    window8 = ps_bench(args, tmp, "window8", ["--servers=1", "--clients=1", "--modes=dense",
                                              "--payloads=4KB", "--window=8"])
    rounds = []
    for i in range(args.repeat):
        rounds.append(tuple(
            ps_bench(args, tmp, "%s-%d" % (name, i),
                     ["--servers=%d" % n, "--clients=%d" % n, "--modes=dense",
                      "--payloads=1MB,64MB", "--repeat=1"])
            for name, n in (("one", 1), ("two", 2))))
    rows = transport_rows(one, window8) + scaling_rows(rounds)
    out = run([os.path.join(args.bin_dir, "server/shard_benchmark"),
               "--benchmark_filter=BM_PairAdamPush64MB", "--benchmark_repetitions=%d" % args.repeat,
               "--benchmark_format=json"])
    rows.append(adam_row(json.loads(out[out.index("{"):])["benchmarks"]))
    if args.memory:
        rows += memory_rows(run([os.path.join(args.bin_dir, "bench/ps_load"), "--servers=1",
                                 "--clients=2", "--tables=21", "--table_floats=4194304",
                                 "--optimizer=adam"]))
    if args.training:
        # Training varies more between runs than the transport rows: --repeat runs, medians.
        runs = []
        for i in range(args.repeat):
            path = os.path.join(tmp, "training-%d.jsonl" % i)
            sets = ([] if args.shared_memory_mb < 0 else
                    ["rpc.shared_memory_mb=%d" % args.shared_memory_mb])
            if args.no_shared_memory_calls:
                sets.append("rpc.shared_memory_calls=false")
            shared = ["--set", ",".join(sets)] if sets else []
            run([sys.executable, "studies/scaling_bench.py", "--models", "mlp", "--cells", "1x1,2x2",
                 "--epochs", str(args.training_epochs), "--bin_dir", args.bin_dir, "--json", path] +
                shared)
            runs.append(read_jsonl(path))
        rows += training_rows(runs)
    return rows


def parse_handoff_probe(text, size="1MB"):
    """handoff_probe's report -> {"plain": us, "streamed": us} for `size` (the median of its
    measurements), or None when the report has no such lines."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == size and parts[1] in ("plain", "streamed"):
            try:
                values = sorted(float(v) for v in parts[2:])
            except ValueError:
                continue
            out[parts[1]] = values[len(values) // 2]
    return out if len(out) == 2 else None


def host_handoff(bin_dir):
    """What handing 1 MB between two cores costs this host now (parse_handoff_probe), or None
    when bench/handoff_probe is not built or fails."""
    probe = os.path.join(bin_dir, "bench/handoff_probe")
    if not os.access(probe, os.X_OK):
        return None
    p = subprocess.run([probe, "--sizes=1MB", "--rounds=3", "--seconds=0.3"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return parse_handoff_probe(p.stdout) if p.returncode == 0 else None


def congestion_control(path="/proc/sys/net/ipv4/tcp_congestion_control"):
    """The kernel's TCP congestion control for new connections ("unknown" if unreadable). It
    moves the raw TCP reference: on loopback, BBR paces each connection with timers, and raw
    TCP ran at half cubic's rate on the development VM (docs/lab/2026-12-02-flow-window.md)."""
    try:
        with open(path) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def missing_binaries(bin_dir, memory, training):
    """The binaries a run with these options needs that are not executables in bin_dir (checked
    before minutes of measurement, not after), as package/name paths."""
    needed = ["bench/ps_bench", "server/shard_benchmark"]
    if memory:
        needed.append("bench/ps_load")
    if training:
        needed += ["server/ps_server", "worker/ps_worker"]
    return [b for b in needed if not os.access(os.path.join(bin_dir, b), os.X_OK)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="also run bench/ps_load")
    ap.add_argument("--training", action="store_true", help="also run studies/scaling_bench.py")
    ap.add_argument("--training_epochs", type=int, default=10,
                    help="epochs of each training run: the README job's 10, the length the "
                         "training targets were first measured at; a run of one epoch is mostly "
                         "its start (2 + 2 calls/compute 0.91-1.08 at 1 epoch against 0.76-0.83 "
                         "at 10 in three interleaved pairs, docs/lab/2026-12-06-late-follower-pause.md)")
    ap.add_argument("--json", help="write the rows here, one JSON object per line")
    ap.add_argument("--shared_memory_mb", type=int, default=-1,
                    help="shared memory between each client and server of ps_bench and the "
                         "training runs (0: payloads by the socket only); -1: the config "
                         "defaults (rpc.shared_memory_mb)")
    ap.add_argument("--no_shared_memory_calls", action="store_true",
                    help="with shared memory, send the calls by the socket (only their payloads "
                         "through the segment): rpc.shared_memory_calls=false")
    args = ap.parse_args()
    missing = missing_binaries(args.bin_dir, args.memory, args.training)
    if missing:
        sys.exit("data_path_targets: not built in %s: %s\n  bazel build %s" % (
            args.bin_dir, ", ".join(missing), " ".join("//%s:%s" % tuple(b.split("/")) for b in missing)))
    before = host_handoff(args.bin_dir)
    with tempfile.TemporaryDirectory(prefix="ps-targets-") as tmp:
        rows = measure(args, tmp)
    after = host_handoff(args.bin_dir)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(table(rows))
    met = sum(r["met"] == "met" for r in rows)
    print("\n%d of %d targets met (TCP congestion control: %s; payloads %s)"
          % (met, len(rows), congestion_control(),
             "by the socket only" if args.shared_memory_mb == 0 else
             "through shared memory between processes of this host, calls by the socket"
             if args.no_shared_memory_calls else
             "and calls through shared memory between processes of this host"))
    if before and after:
        print("Host: 1 MB handed between two cores (bench/handoff_probe), before / after the run: "
              "plain stores %.0f / %.0f us, streamed %.0f / %.0f us"
              % (before["plain"], after["plain"], before["streamed"], after["streamed"]))


if __name__ == "__main__":
    main()
