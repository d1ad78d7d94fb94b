#!/usr/bin/env python3
"""A real multi-host job on one machine: 2 server hosts and 2 worker hosts as network namespaces.

    bazel test //tests:netns_e2e_test                                  # as root
    bazel test //tests:netns_e2e_test --test_arg=--shape=1gbit       # links shaped with tbf

Four network namespaces, each with its own address in a private subnet, are joined by veth
pairs to one bridge (which has no address: nothing reaches the host's own network). The job
(configs/fashion_mnist_2x2_async.textproto) runs across them through
`tools/launch_ssh.py --exec "ip netns exec {host}"`; while it trains, `psctl status` from a
worker host must show the live job (updates growing on every server, both workers live with
advancing clocks), and every process's Prometheus /metrics, scraped twice from that host, must
parse and show the job moving (updates applied, push and pull counts, worker steps). The run stops early once worker 0's test accuracy reaches --target (each
worker evaluates every epoch), at most --epochs epochs; the final accuracy must be >= --target,
every process must exit 0, and every server must write its final checkpoint.

Needs root and `ip netns`; otherwise it prints why and passes as skipped. Namespaces, bridge
and processes are removed on every exit path, also those of an earlier run that was killed.
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
import threading
import time


def runfiles_root():
    """(source root, binaries root): the runfiles tree under Bazel, else this checkout."""
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, "ps"), os.path.join(srcdir, "ps")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root, os.path.join(root, "bazel-bin")


ROOT, BIN_DIR = runfiles_root()
sys.path.insert(0, os.path.join(ROOT, "tools"))
from launch_common import die_with_parent  # noqa: E402
from netns import Network, check_netns, rate_bits  # noqa: E402

TAG = "ps"  # namespaces pse2e-<pid>-<host>, bridge psbr<pid>, veths psv<pid><host> (tools/netns.py)
SUBNET = "10.77.0"
CONFIG = "configs/fashion_mnist_2x2_async.textproto"
HOSTS = [("s0", "server", 1), ("s1", "server", 2), ("w0", "worker", 3), ("w1", "worker", 4)]
SERVER_PORT = 7000


def log(msg):
    sys.stdout.write("[netns_e2e] %s\n" % msg)
    sys.stdout.flush()


def skip(reason):
    """Passes as skipped: prints why, and says so in the test.xml Bazel reads."""
    log("SKIPPED: " + reason)
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        reason = reason.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
        with open(xml, "w") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="netns_e2e_test" '
                    'tests="1" failures="0" errors="0" skipped="1"><testcase name="NetnsE2E.TrainsAcrossHosts" '
                    'classname="netns_e2e_test"><skipped message="%s"/></testcase></testsuite></testsuites>\n'
                    % reason)
    sys.exit(0)


def check_root():
    reason = check_netns()
    if reason:
        skip(reason + "; run as root to test" if reason.startswith("needs root") else reason)


class Psctl:
    """Polls `psctl status --json` from a worker host until it has seen the job live."""

    def __init__(self, psctl, config, ns, servers):
        self.argv = ["ip", "netns", "exec", ns, psctl, "status", "--config=" + config,
                     "--servers=" + ",".join(servers), "--json", "--rate_interval_s=1", "--timeout_s=10"]
        self.text_argv = [a for a in self.argv if a != "--json"]
        self.servers = servers
        self.previous = None
        self.seen_live = False
        self.ns = ns
        self.metrics_error = "never scraped"

    def sample(self):
        try:
            p = subprocess.run(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None
        if p.returncode != 0:
            return None
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return {r["address"]: r for r in rows}

    def check(self, now):
        """True once two samples show every server applying updates and both workers live."""
        if self.previous is None or set(now) != set(self.servers):
            return False
        # proto3 JSON: 64-bit integers are strings, and zeros / false are left out.
        def updates(stats):
            return int(stats.get("updates_applied", 0))

        def clocks(stats):
            return {w.get("worker_id", 0): int(w.get("clock", 0)) for w in stats.get("worker_clocks", [])}

        ok = True
        for address in self.servers:
            before, after = self.previous[address]["stats"], now[address]["stats"]
            live = {w.get("worker_id", 0) for w in after.get("worker_clocks", []) if w.get("live")}
            ok &= updates(after) > updates(before)
            ok &= live == {0, 1}
            ok &= any(clocks(after).get(w, 0) > c for w, c in clocks(before).items())
        return ok

    def watch(self, done):
        """Runs until the job is seen live or `done` is set (the job ended)."""
        while not done.is_set():
            now = self.sample()
            if now is not None:
                if self.check(now):
                    self.seen_live = True
                    for address in self.servers:
                        s = now[address]["stats"]
                        log("psctl: %s applied %s updates (%.0f/s), worker clocks %s" % (
                            address, s.get("updates_applied", 0), now[address]["updates_per_s"],
                            {w.get("worker_id", 0): w.get("clock", "0") for w in s.get("worker_clocks", [])}))
                    # The metrics first, while the job surely still trains; then the table.
                    workers = ["%s.%d:0" % (SUBNET, o) for _, role, o in HOSTS if role == "worker"]
                    try:
                        check_metrics(self.ns, self.servers, workers)
                        self.metrics_error = None
                    except (AssertionError, ValueError, subprocess.SubprocessError) as e:
                        self.metrics_error = str(e)
                    table = subprocess.run(self.text_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, timeout=60).stdout
                    log("psctl status (table):\n" + table)
                    return
                self.previous = now
            done.wait(0.5)


METRICS_PORT = 9100  # every host (namespace) has its own ports

# Reads a Prometheus text page and prints {"name{labels}": value} as JSON (run in a namespace).
SCRAPE = r"""
import json, sys, urllib.request
out = {}
for line in urllib.request.urlopen(sys.argv[1], timeout=10).read().decode().splitlines():
    if line and not line.startswith("#"):
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
print(json.dumps(out))
"""


def scrape(ns, address):
    host = address.rsplit(":", 1)[0]
    url = "http://%s:%d/metrics" % (host, METRICS_PORT)
    p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", SCRAPE, url],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError("scraping %s from %s failed:\n%s" % (url, ns, p.stdout))
    return json.loads(p.stdout)


def check_metrics(ns, servers, workers):
    """Prometheus /metrics of every server and worker, scraped twice from worker 0's host
    while the job trains: the pages parse and a few values move between the scrapes."""
    def total(page, name):
        return sum(v for k, v in page.items() if k == name or k.startswith(name + "{"))

    first = {a: scrape(ns, a) for a in servers + workers}
    time.sleep(1)
    second = {a: scrape(ns, a) for a in servers + workers}
    for a in servers:
        before, after = first[a], second[a]
        assert after.get("ps_server_up") == 1, "%s: ps_server_up is not 1" % a
        # A step is one PushPull call, timed as a push; its pull part counts among the pulls
        # served. Calls that only pull (each epoch's first, an evaluation's) are timed as pulls:
        # some by now, but not necessarily between the scrapes.
        for name in ("ps_server_updates_applied_total", "ps_server_push_latency_seconds_count",
                     "ps_server_pulls_total"):
            assert total(after, name) > total(before, name), "%s: %s did not grow (%s -> %s)" % (
                a, name, total(before, name), total(after, name))
        assert total(after, "ps_server_pull_latency_seconds_count") >= 1, "%s: no pull timed" % a
        assert total(after, "ps_server_table_rows") > 0, "%s holds no rows" % a
        log("metrics %s: %d updates applied, %d pushes timed, %d rows" % (
            a, total(after, "ps_server_updates_applied_total"),
            total(after, "ps_server_push_latency_seconds_count"), total(after, "ps_server_table_rows")))
    for a in workers:
        grew = total(second[a], "ps_worker_steps_total") > total(first[a], "ps_worker_steps_total")
        assert grew, "%s: ps_worker_steps_total did not grow" % a
        log("metrics %s: %d steps, %.0f samples/s" % (
            a, total(second[a], "ps_worker_steps_total"), total(second[a], "ps_worker_samples_per_second")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="",
                    help="shape every link with tc tbf at this rate, e.g. 1gbit (default: off)")
    ap.add_argument("--epochs", type=int, default=15, help="at most this many epochs")
    ap.add_argument("--target", type=float, default=0.88, help="test accuracy to reach")
    args = ap.parse_args()
    if args.shape:
        try:
            rate_bits(args.shape)
        except ValueError as e:
            ap.error("--shape: %s" % e)

    check_root()
    root, bin_dir = ROOT, BIN_DIR
    os.chdir(root)
    Network.remove_stale(tag=TAG, log=log)
    net = Network(os.getpid(), [(h, o) for h, _, o in HOSTS], tag=TAG, subnet=SUBNET, log=log)
    work = tempfile.mkdtemp(prefix="ps-netns-e2e-", dir=os.environ.get("TEST_TMPDIR"))
    launcher = None

    def on_term(signum, _frame):
        raise SystemExit("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        net.create(args.shape)
        servers = ["%s.%d:%d" % (SUBNET, o, SERVER_PORT) for _, role, o in HOSTS if role == "server"]
        with open(os.path.join(work, "hosts"), "w") as f:
            for host, role, octet in HOSTS:
                f.write("%s %s addr=%s.%d%s\n" % (role, net.ns(host), SUBNET, octet,
                                                   " port=%d" % SERVER_PORT if role == "server" else ""))
        argv = [sys.executable, os.path.join(root, "tools/launch_ssh.py"), os.path.join(work, "hosts"),
                os.path.join(root, CONFIG), "--exec", "ip netns exec {host}", "--bin_dir", bin_dir,
                "--remote_dir", os.path.join(work, "hosts-dir"), "--log_dir", os.path.join(work, "logs"),
                "--set", "training.epochs=%d" % args.epochs, "--set", "training.target_metric=%g" % args.target,
                # Batches of 16 (the config's 64 reach the target within 6-9 s here, too soon for
                # the checks below, which need the job live for a few seconds after psctl saw
                # it): four times the steps, each one a round trip across the emulated network.
                "--set", "training.batch_size=16",
                # The hosts share one kernel: without this, payloads would skip the emulated
                # network through shared memory.
                "--set", "rpc.shared_memory_mb=0",
                # Every worker evaluates, so each stops at the target instead of running every epoch.
                "--worker_arg=--eval=always", "--worker_arg=--wait_for_servers_s=30",
                "--server_arg=--metrics_port=%d" % METRICS_PORT, "--worker_arg=--metrics_port=%d" % METRICS_PORT]
        log("running: " + " ".join(argv))
        start = time.time()
        # If this test is killed outright, the launcher still gets SIGTERM and stops the job.
        launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True, preexec_fn=die_with_parent)
        psctl = Psctl(os.path.join(bin_dir, "tools/psctl"), os.path.join(root, CONFIG), net.ns("w0"), servers)
        done = threading.Event()
        watcher = None
        lines = []
        for line in launcher.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\n"))
            if watcher is None and "[launch] servers ready at" in line:
                watcher = threading.Thread(target=psctl.watch, args=(done,), daemon=True)
                watcher.start()
        code = launcher.wait()
        wall = time.time() - start
        done.set()
        if watcher is not None:
            watcher.join(120)

        failures = []
        if code != 0:
            failures.append("launch_ssh.py exited with %d" % code)
        accuracy = [float(m.group(1)) for l in lines
                    for m in [re.search(r"^\[worker 0@\S+\] final test accuracy ([0-9.]+)", l)] if m]
        epochs = [int(m.group(1)) for l in lines
                  for m in [re.search(r"^\[worker 0@\S+\] worker 0  epoch (\d+)  test accuracy", l)] if m]
        if not accuracy:
            failures.append("worker 0 printed no final test accuracy")
        elif accuracy[-1] < args.target:
            failures.append("final test accuracy %.4f < %.2f" % (accuracy[-1], args.target))
        for i in range(2):
            if not any(re.match(r"^\[server %d@\S+\] .*final checkpoint \d+" % i, l) for l in lines):
                failures.append("server %d wrote no final checkpoint" % i)
        if psctl.seen_live and psctl.metrics_error:
            failures.append("/metrics: " + psctl.metrics_error)
        if not psctl.seen_live:
            failures.append("psctl status never showed the job live (updates growing on both servers, "
                            "workers 0 and 1 live with advancing clocks)")
        log("across namespaces: test accuracy %s after %s epochs, %.1f s" % (
            accuracy[-1] if accuracy else "-", epochs[-1] if epochs else "-", wall))
        if failures:
            log("FAILED: " + "; ".join(failures))
            return 1
        log("PASSED")
        return 0
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)  # it stops every process in every namespace
            try:
                launcher.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
        Network.remove(os.getpid(), tag=TAG)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
