#!/usr/bin/env python3
"""Validates tools/ps_advise.py's model against a crossover study: predicts every run of a
studies/crossover_study.py JSON-lines file from the inputs the advisor would measure, next to
what the study measured; --fit also fits the gRPC CPU factor, leaving each link out in turn.

    /usr/bin/python3 studies/advise_validation.py docs/runs/crossover-2026-12-06.jsonl [--fit] [--cores 2] [--json]
"""

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "studies"))
import crossover_study  # noqa: E402
from launch_common import get  # noqa: E402
from ps_advise import GRPC_CPU_FACTOR, STRAGGLER, predict  # noqa: E402
from link_probe import exchange_key  # noqa: E402
from step_cost import busiest_server_share, load as load_config, model_bytes, period_bytes, step_bytes  # noqa: E402


def validate(path, cores, bin_dir, cpu_factor=GRPC_CPU_FACTOR, straggler=STRAGGLER):
    """Predictions for every run of a studies/crossover_study.py JSON-lines file, next to its measurement.

    The inputs are the study's own measurements of the same window, as the advisor would make
    them: compute per step from the centralized run on the same link, a step's pull + push on
    loopback from the 1x1 run on loopback (those runs are the inputs, not predicted), the link
    from the study's probe. For the loopback link that run is the asynchronous one, whose calls
    go through shared memory as on any one host; for links between hosts, the one by the socket
    (mode async-socket) where the file has it (files before 2026-12-06 have only the first).
    Returns (rows, {model: the loopback step's costs by shared memory, with `socket_step` the
    grpc_step by the socket where there is one}).
    """
    MODELS, load = crossover_study.MODELS, crossover_study.load  # noqa: N806
    rows = [r for r in load(path) if r.get("kind") != "target"]
    probes = {r["link"]: r for r in rows if r["mode"] == "probe"}
    grpc, by_socket, out = {}, {}, []

    def is_input(r):
        return r["link"] == "loopback" and r["mode"] in ("async", "async-socket") and \
            (r["servers"], r["workers"]) == (1, 1)

    for r in rows:
        if r["mode"] == "probe" or not is_input(r):
            continue
        config, sets = MODELS[r["model"]]
        push_b, pull_b = step_bytes(bin_dir, os.path.join(ROOT, config), sets)
        lo = probes.get("loopback", {}).get("exchange_s", {}).get(exchange_key(push_b, pull_b))
        if lo is None:
            raise SystemExit("advise_validation: %s has no loopback probe of a %s step" % (path, r["model"]))
        g = dict(grpc_step=(r["pull_s"] + r["push_s"]) / max(1, r["steps"]), loopback_exchange_s=lo)
        (by_socket if r["mode"] == "async-socket" else grpc)[r["model"]] = g
    for r in rows:
        if r["mode"] in ("probe", "centralized", "centralized-all-cores", "async-socket") or r["model"] not in grpc:
            continue
        if is_input(r):
            continue
        config, sets = MODELS[r["model"]]
        central = [c for c in rows if c["mode"] == "centralized" and c["model"] == r["model"] and c["link"] == r["link"]]
        if not central or r["link"] not in probes:
            continue
        c = central[-1]
        n = max(1, c["steps"])
        m = dict(compute=c["compute_s"] / n, apply=c["push_s"] / n, pull=c["pull_s"] / n)
        cfg = load_config(bin_dir, os.path.join(ROOT, config), sets)
        batch = int(get(cfg, "training.batch_size", 64))
        kind, pull_b, push_b, keys, _ = model_bytes(cfg, batch)
        m.update(kind=kind, pull_bytes=pull_b, push_bytes=push_b, period_bytes=period_bytes(cfg, batch, (4,)),
                 server_share={r["servers"]: busiest_server_share(cfg, r["servers"])})
        mode = {"async": "async", "BSP": "BSP", "lsgd4": "local SGD k=4"}[r["mode"]]
        g = grpc[r["model"]] if r["link"] == "loopback" else by_socket.get(r["model"], grpc[r["model"]])
        preds = predict(m, g, probes[r["link"]], cores, [r["workers"]], [r["servers"]], batch,
                        cpu_factor=cpu_factor, straggler=straggler)
        p = [x for x in preds if x["mode"] == mode][0]
        base = batch / (m["compute"] + m["apply"] + m["pull"])
        steps = max(1, r["steps"])
        out.append(dict(model=r["model"], link=r["link"], mode=r["mode"], servers=r["servers"], workers=r["workers"],
                        measured=r["samples_per_s"], predicted=p["samples_per_s"], bound=p["bound"],
                        error=p["samples_per_s"] / r["samples_per_s"] - 1,
                        measured_vs_central=r["samples_per_s"] / c["samples_per_s"], predicted_vs_central=
                        p["samples_per_s"] / base, bytes_predicted=pull_b + push_b,
                        bytes_measured=(r["bytes_sent"] + r["bytes_received"]) / steps))
    if not out:
        raise SystemExit("advise_validation: %s: nothing to validate (needs per model an asynchronous 1x1 run on loopback, "
                         "a loopback probe, and per link a probe and a centralized run)" % path)
    for model, g in by_socket.items():
        if model in grpc:
            grpc[model]["socket_step"] = g["grpc_step"]
    return out, grpc


FIT_GRID = [0.5 + 0.25 * i for i in range(15)]  # cpu_factor candidates, 0.5 .. 4.0


def fit_cpu_factor(path, cores, bin_dir):
    """Leave one link out: for each link, the cpu_factor that minimizes the other links' mean
    |log(predicted / measured)|, then that link's rows predicted with it. Returns (rows predicted
    out of sample, {link: factor}, the factor fitted on every link)."""
    by_factor = {f: validate(path, cores, bin_dir, cpu_factor=f)[0] for f in FIT_GRID}

    def loss(rows):
        return sum(abs(math.log(r["predicted"] / r["measured"])) for r in rows) / max(1, len(rows))

    unique = crossover_study.unique
    chosen, out = {}, []
    for link in unique(r["link"] for r in by_factor[FIT_GRID[0]]):
        f = min(FIT_GRID, key=lambda f: loss([r for r in by_factor[f] if r["link"] != link]))
        chosen[link] = f
        out += [r for r in by_factor[f] if r["link"] == link]
    overall = min(FIT_GRID, key=lambda f: loss(by_factor[f]))
    return out, chosen, overall


def print_validation(rows):
    print("\n| model | link | mode | servers x workers | measured samples/s | predicted | error | "
          "measured / predicted vs centralized | MB per step (model / measured) | predicted bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %s | %dx%d | %.0f | %.0f | %+.0f%% | %.2fx / %.2fx | %.3f / %.3f | %s |" % (
            r["model"], r["link"], r["mode"], r["servers"], r["workers"], r["measured"], r["predicted"],
            100 * r["error"], r["measured_vs_central"], r["predicted_vs_central"], r["bytes_predicted"] / 1e6,
            r["bytes_measured"] / 1e6, r["bound"]))
    within = sum(abs(r["error"]) <= 0.25 for r in rows)
    print("\nwithin 25%%: %d of %d" % (within, len(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a studies/crossover_study.py JSON-lines file")
    ap.add_argument("--cores", type=int, default=None, help="cores all processes shared (default: this machine's)")
    ap.add_argument("--fit", action="store_true", help="also fit the gRPC CPU factor, leaving each link out in turn")
    ap.add_argument("--json", action="store_true", help="also print each row as JSON")
    ap.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"),
                    help="where server/ps_server is (it reads the configs; default: bazel-bin)")
    args = ap.parse_args()
    cores = args.cores or os.cpu_count()
    rows, grpc = validate(args.results, cores, args.bin_dir)
    for model, g in grpc.items():
        print("a %s step's pull + push on loopback (the study's async 1x1 run): %.2f ms%s; the same bytes "
              "over raw TCP: %.2f ms" % (model, g["grpc_step"] * 1e3,
                                         " (by the socket: %.2f ms)" % (g["socket_step"] * 1e3)
                                         if "socket_step" in g else "", g["loopback_exchange_s"] * 1e3))
    print("\nWith the built-in constants (cpu_factor %.2f, BSP straggler %.2f per extra worker):" % (
        GRPC_CPU_FACTOR, STRAGGLER))
    print_validation(rows)
    if args.fit:
        fitted, chosen, overall = fit_cpu_factor(args.results, cores, args.bin_dir)
        print("\nWith cpu_factor fitted on the other links (leave one link out: %s; on all links: %.2f):" % (
            ", ".join("%s %.2f" % kv for kv in chosen.items()), overall))
        print_validation(fitted)
    if args.json:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError) as e:  # unreadable files, malformed results
        sys.exit("advise_validation: %s" % e)
