#!/usr/bin/env python3
"""Predicts samples/s of a job centralized and on 1..N workers, and says which to run.

    tools/ps_advise.py configs/fashion_mnist_2x2_async.textproto [--set model.mlp.hidden=2048,2048]
        [--link 1gbit | --probe_exec_server "ip netns exec A" --probe_exec_client "ip netns exec B"
         --probe_addr 10.0.0.1] [--cores 2] [--max_workers 4] [--servers 1,2] [--json]

What it measures on this machine (about 20 s):
  1. compute per step: a short centralized run (ps_worker --centralized, training.max_steps)
     with one BLAS thread, as each worker has; its JSON log gives compute_s (forward +
     backward) and push_s (in-process optimizer apply). Where --cores (default: this
     machine's) and this machine both have several, a second one with a BLAS thread per
     core (as many as --cores, at most this machine's): one process on those cores.
  2. a step's transfers: a short job of one ps_server and one ps_worker on loopback
     (tools/launch_ssh.py); the worker's pull and push time per step (serialization, gRPC,
     the server's lookups and optimizer). On loopback this is what a step's transfers cost
     in CPU, on any link. For a link between hosts (--link RATE or --probe_*) the job sends
     its calls and payloads by the socket (rpc.shared_memory_mb=0), as between hosts; for one
     host (the default) through shared memory, as a cluster on one host does.
  3. the link: a Python TCP ping-pong, a 32 MB stream and the median time of a step's bytes
     (push bytes out, pull bytes back, back to back) between two hosts (--probe_*), on
     loopback (the default), or only a rate given with --link (no latency).
Bytes per step come from the model: an MLP pulls and pushes every weight (4 bytes each);
a CTR model pulls and pushes one row (8-byte key + 4 * dim bytes) per unique key of a batch,
the expected count under the generator's Zipf popularity.

The model (all times per step of one worker, batch b):
  transfers          = loopback step transfers + what the link adds: the probe's step time
                       minus its loopback time (gRPC serializes a whole message, then sends
                       it: the two add up), or without a probe (pull + push bytes) / rate + 2 rtt
  step_async         = compute + transfers (the server applies the optimizer inside the push)
  server link bound  = link_rate / (share * max(pull, push bytes)) steps/s, share = the
                       busiest server's part of a step's bytes (1/S when the tables spread
                       evenly; a model of few dense blocks lands unevenly: step_cost.py), W
                       workers sharing the servers' links, pushes in and pulls out at once;
                       if the link was probed, only when W * share > 1 (else the measured
                       step covers it)
  CPU bound          = min(cores, W + S) * b / cpu_per_step, cpu_per_step = compute +
                       cpu_factor (1.75) * the loopback step transfers
  async samples/s    = min(W * b / step_async, server link bound, CPU bound)
  BSP                = async with every step waiting for the slowest worker (+ barrier rtt,
                       + a straggler allowance of 5% per extra worker)
  local SGD k        = compute + the optimizer on the worker every step, the transfers once
                       per k steps (for a sparse model: of every row the k batches touched)
Centralized = b / (compute + apply + in-process pull), with one thread and with a thread per
core. The recommendation is the fastest prediction, preferring the faster centralized run
unless a cluster is at least 1.1x faster.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from job_runs import launch_argv, parse_run, read_logs  # noqa: E402
from link_probe import exchange_key, probe_link  # noqa: E402, F401
from launch_common import get  # noqa: E402
from step_cost import busiest_server_share, load, model_bytes, period_bytes, step_bytes  # noqa: E402, F401

# CPU seconds (worker + server) per second of a step's transfers on loopback: fitted on the
# crossover study of 2026-12-06 (`studies/advise_validation.py docs/runs/crossover-2026-12-06.jsonl
# --fit`: 1.75 on all links in both of that day's runs; with one link left out 1.5-1.75 on
# the 05:27 run, 1.5-2.0 on the 04:44 one; 1.25 on the study of 2026-11-30).
GRPC_CPU_FACTOR = 1.75
STRAGGLER = 0.05        # BSP: extra step time per additional worker


# ---------------------------------------------------------------- the model's bytes per step

# ---------------------------------------------------------------- measurements

def measure_compute(worker, config, sets, steps, threads=1):
    """Per-step seconds of a short centralized run: dict(compute, apply, pull, step, batch)."""
    log = tempfile.mktemp(prefix="ps-advise-", suffix=".jsonl")
    argv = [worker, "--config=" + config, "--centralized", "--eval=never", "--threads=%d" % threads,
            # One --set: the binaries keep only the last one.
            "--log_path=" + log, "--set=" + ",".join(list(sets) + ["training.max_steps=%d" % steps,
                                                                  "training.epochs=1000"])]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit("ps_advise: centralized run failed:\n" + p.stdout[-2000:])
    done = [json.loads(l) for l in open(log) if '"type":"done"' in l][-1]
    os.unlink(log)
    n = done["steps"]
    return dict(compute=done["compute_s"] / n, apply=done["push_s"] / n, pull=done["pull_s"] / n,
                step=done["wall_s"] / n, batch=done["samples"] / n, samples_per_s=done["samples_per_s"])


def measure_step(bin_dir, config, sets, steps, shared_memory=True):
    """Seconds of one worker step's pull + push, gRPC included, on a real 1-server, 1-worker job
    on loopback (tools/launch_ssh.py, this host): what a step's transfers cost in CPU and time,
    apart from the link, for any model (dense or sparse, the server's optimizer included).
    `shared_memory` False sends the calls and payloads by the socket, as between hosts."""
    work = tempfile.mkdtemp(prefix="ps-advise-step-")
    socket = [] if shared_memory else ["rpc.shared_memory_mb=0"]
    try:
        argv = launch_argv(["server 127.0.0.1 port=0", "worker 127.0.0.1"], config,
                           list(sets) + socket + ["training.max_steps=%d" % steps, "training.epochs=1000"], bin_dir,
                           work, "", "never")
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise SystemExit("ps_advise: the loopback job failed:\n" + p.stdout[-2000:])
        r = parse_run(p.stdout, read_logs(os.path.join(work, "logs")))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not r["steps"]:
        raise SystemExit("ps_advise: the loopback job reported no steps")
    return (r["pull_s"] + r["push_s"]) / r["steps"]


# ---------------------------------------------------------------- prediction

def predict(m, g, link, cores, workers, servers, batch, ks=(4,), cpu_factor=GRPC_CPU_FACTOR,
            straggler=STRAGGLER):
    """List of dicts (mode, servers, workers, samples_per_s, bound) for every candidate."""
    out = [dict(mode="centralized", servers=0, workers=1, bound="compute",
                samples_per_s=batch / (m["compute"] + m["apply"] + m["pull"]))]
    if m.get("all_cores"):
        a = m["all_cores"]
        out.append(dict(mode="centralized, all cores", servers=0, workers=1,
                        bound="compute on %d BLAS threads" % a["threads"],
                        samples_per_s=batch / (a["compute"] + a["apply"] + a["pull"])))
    bw, rtt = link["bandwidth_Bps"], link["rtt_s"]

    # A real loopback step's pull + push (serialization, gRPC, the server's apply), then what
    # the link adds to it: gRPC serializes a whole message before sending it, so the wire time
    # adds to it rather than overlapping.
    cpu_transfers = g["grpc_step"]
    exchange = link.get("exchange_s", {}).get(exchange_key(m["push_bytes"], m["pull_bytes"]))
    if exchange is not None:
        wire = max(0.0, exchange - g.get("loopback_exchange_s", 0.0))
    else:
        wire = (m["pull_bytes"] + m["push_bytes"]) / bw + 2 * rtt
    t_transfers = cpu_transfers + wire
    # A step is one call per server (PushPull): its push goes in and its pull comes back on
    # the two directions of the server's link, and workers sharing a server fall out of phase,
    # so one worker's push overlaps another's answer. (Before 2026-12-06 this summed the two:
    # workers that pulled, then pushed, in phase. The crossover study of that day measured
    # 1-server, 2-worker clusters at the rate of one link per direction: CTR at 1 Gbit/s
    # 170,831 samples/s, where the sum of both directions allowed about 95,000; the small
    # model at 100 Mbit/s 3,650 against 1,886.)
    step_bytes = max(m["pull_bytes"], m["push_bytes"])

    def bounded(w, s, every):
        """(samples/s, what bounds it) with the transfers once per `every` steps."""
        # Local SGD applies the optimizer on the worker every step; otherwise the server does,
        # inside the push. Its delta holds every row the period touched: for a sparse model
        # more than one step's rows (period_bytes: a period's bytes over one step's).
        apply = m["apply"] if every > 1 else 0.0
        per = m.get("period_bytes", {}).get(every, 1.0) / every
        step = m["compute"] + apply + t_transfers * per
        cands = [(w * batch / step, "per-worker step (%.1f ms: compute %.1f, transfers %.1f)" % (
            step * 1e3, m["compute"] * 1e3, t_transfers * per * 1e3))]
        # The busiest server's link carries its share of every worker's bytes, each direction.
        # Where that is no more than one worker's link carries, a measured exchange already
        # holds what one link does to a step's bytes (the worker's own link is the narrower
        # one).
        share = m.get("server_share", {}).get(s, 1.0 / s)
        if exchange is None or w * share > 1 + 1e-9:
            cands.append((batch * bw / (share * step_bytes * per), "the servers' links"))
        cpu = m["compute"] + apply + cpu_factor * cpu_transfers * per
        cands.append((min(cores, w + s) * batch / cpu, "CPU (%d cores for %d processes)" % (cores, w + s)))
        return min(cands)

    for s in servers:
        for w in workers:
            r, why = bounded(w, s, 1)
            out.append(dict(mode="async", servers=s, workers=w, samples_per_s=r, bound=why))
            if w > 1:
                out.append(dict(mode="BSP", servers=s, workers=w, bound=why,
                                samples_per_s=w * batch / (w * batch / r * (1 + straggler * (w - 1)) + rtt)))
            for k in ks:
                r, why = bounded(w, s, k)
                out.append(dict(mode="local SGD k=%d" % k, servers=s, workers=w, samples_per_s=r, bound=why))
    return out


def shape(p):
    """"1 server x 2 workers"."""
    return "%d server%s x %d worker%s" % (p["servers"], "s" * (p["servers"] != 1), p["workers"],
                                          "s" * (p["workers"] != 1))


def recommend(preds, min_gain):
    central = max((p for p in preds if p["mode"].startswith("centralized")), key=lambda p: p["samples_per_s"])
    best = max((p for p in preds if not p["mode"].startswith("centralized")), key=lambda p: p["samples_per_s"])
    if best["samples_per_s"] < min_gain * central["samples_per_s"]:
        return central, ("%s: the best cluster (%s, %s, %.0f samples/s, bound by %s) "
                         "is not %.2fx faster than one process (%.0f samples/s)" % (
                             central["mode"], best["mode"], shape(best), best["samples_per_s"],
                             best["bound"], min_gain, central["samples_per_s"]))
    return best, ("%s on %s: %.0f samples/s, %.2fx %s (%.0f); bound by %s" % (
        best["mode"], shape(best), best["samples_per_s"],
        best["samples_per_s"] / central["samples_per_s"], central["mode"], central["samples_per_s"], best["bound"]))


def advise(config, sets, bin_dir, link_spec=None, probe=None, cores=None, max_workers=4, servers=(1, 2),
           steps=None, measured=None):
    """Runs the measurements (or takes `measured`) and returns a report dict."""
    cfg = load(bin_dir, config, sets)
    batch = int(get(cfg, "training.batch_size", 64))
    kind, pull_b, push_b, keys, _ = model_bytes(cfg, batch)
    cores = cores or os.cpu_count()
    if measured is None:
        worker = os.path.join(bin_dir, "worker/ps_worker")
        m = measure_compute(worker, config, sets, steps or 50)
        # One process on the cores the cluster's processes would share (at most this
        # machine's).
        threads = min(cores, os.cpu_count() or 1)
        if threads > 1:
            m["all_cores"] = dict(measure_compute(worker, config, sets, steps or 50, threads=threads),
                                  threads=threads)
        loopback = probe_link([], [], "127.0.0.1", port=0, exchanges=[(push_b, pull_b)])
        # Processes on one host pass calls through shared memory; between hosts, the socket.
        one_host = not probe and (not link_spec or link_spec == "loopback")
        g = dict(grpc_step=measure_step(bin_dir, config, sets, steps or 50, shared_memory=one_host),
                 loopback_exchange_s=loopback["exchange_s"][exchange_key(push_b, pull_b)],
                 transport="shared memory" if one_host else "socket")
        if probe:
            link = probe_link(*probe, exchanges=[(push_b, pull_b)])
        elif link_spec and link_spec != "loopback":
            from netns import rate_bits
            link = {"bandwidth_Bps": rate_bits(link_spec) / 8, "rtt_s": 0.0}
        else:
            link = loopback
    else:
        m, g, link = measured
    m = dict(m, kind=kind, pull_bytes=pull_b, push_bytes=push_b, period_bytes=period_bytes(cfg, batch, (4,)),
             server_share={s: busiest_server_share(cfg, s) for s in servers})
    preds = predict(m, g, link, cores, list(range(1, max_workers + 1)), list(servers), batch)
    choice, why = recommend(preds, 1.1)
    return dict(config=config, sets=sets, batch=batch, kind=kind, pull_bytes=pull_b, push_bytes=push_b,
                unique_keys=keys, compute=m, grpc=g, link=link, cores=cores, predictions=preds,
                recommendation=choice, reason=why)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the job config")
    ap.add_argument("--set", action="append", default=[], help="config override path=value (repeatable)")
    ap.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"))
    ap.add_argument("--link", default="loopback", help="loopback (probed) or a rate like 1gbit (taken as given)")
    ap.add_argument("--probe_exec_server", default=None, help="command prefix running on the server host")
    ap.add_argument("--probe_exec_client", default=None, help="command prefix running on the worker host")
    ap.add_argument("--probe_addr", default=None, help="the server host's address for the probe")
    ap.add_argument("--cores", type=int, default=None, help="cores all processes share (default: this machine's)")
    ap.add_argument("--max_workers", type=int, default=4)
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--steps", type=int, default=30, help="steps of the centralized measurement")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = ap.parse_args()
    for flag, value in (("--max_workers", args.max_workers), ("--cores", args.cores), ("--steps", args.steps)):
        if value is not None and value < 1:
            ap.error("%s must be at least 1, got %d" % (flag, value))
    try:
        servers = [int(s) for s in args.servers.split(",")]
    except ValueError:
        ap.error("--servers: a comma-separated list of server counts, got %r" % args.servers)
    if min(servers) < 1:
        ap.error("--servers: every count must be at least 1, got %r" % args.servers)
    if args.link != "loopback":
        from netns import rate_bits
        rate_bits(args.link)  # a bad rate is refused before anything is measured
    probe = None
    if args.probe_addr:
        probe = (shlex.split(args.probe_exec_server or ""), shlex.split(args.probe_exec_client or ""),
                 args.probe_addr)
    rep = advise(args.config, args.set, args.bin_dir, args.link, probe, args.cores, args.max_workers,
                 servers, args.steps)
    if args.json:
        print(json.dumps(rep))
        return
    m, g, l = rep["compute"], rep["grpc"], rep["link"]
    print("model: %s, batch %d, %.2f MB pulled and %.2f MB pushed per step%s" % (
        rep["kind"], rep["batch"], rep["pull_bytes"] / 1e6, rep["push_bytes"] / 1e6,
        " (%.0f unique keys)" % rep["unique_keys"] if rep["unique_keys"] else ""))
    print("measured: compute %.2f ms, optimizer apply %.2f ms, in-process pull %.2f ms per step; a step's pull + "
          "push over gRPC on loopback %.2f ms (%s; raw TCP: %.2f ms); link %.0f MB/s, rtt %.3f ms%s; %d cores" % (
              m["compute"] * 1e3, m["apply"] * 1e3, m["pull"] * 1e3, g["grpc_step"] * 1e3,
              g.get("transport", "socket"),
              g["loopback_exchange_s"] * 1e3, l["bandwidth_Bps"] / 1e6, l["rtt_s"] * 1e3,
              "".join(", a step's bytes %.2f ms" % (v * 1e3) for v in l.get("exchange_s", {}).values()),
              rep["cores"]))
    print("\n| mode | servers | workers | predicted samples/s | vs centralized (1 thread) | bound by |")
    print("|---|---|---|---|---|---|")
    base = rep["predictions"][0]["samples_per_s"]
    for p in rep["predictions"]:
        print("| %s | %s | %d | %.0f | %.2fx | %s |" % (p["mode"], p["servers"] or "-", p["workers"],
                                                       p["samples_per_s"], p["samples_per_s"] / base, p["bound"]))
    print("\nrecommended: " + rep["reason"])


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError) as e:  # unreadable files, malformed configs or logs
        sys.exit("ps_advise: %s" % e)
