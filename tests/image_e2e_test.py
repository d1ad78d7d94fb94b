#!/usr/bin/env python3
"""The container image: tools/build_image.sh builds it, and a job runs from it.

    bazel test //tests:image_e2e_test                                   # as root, with buildah

Builds the image with Fashion-MNIST baked in (tools/build_image.sh --with-data) into a private
buildah storage under the test's temp dir, checks the archive's one layer (the binaries and
data are there, no shell, the data directory belongs to the image's user), then starts one
ps_server and one ps_worker in two containers made from the oci-archive, with
`buildah run --isolation=chroot`, on 127.0.0.1 (host network; the server picks a free port and
writes it to --port_file). The config comes from a read-only mount at /etc/ps, each process's
/var/lib/ps is a host directory. While the server runs, it must answer grpc.health.v1 Check
with SERVING (what Kubernetes' grpc readiness probe asks), answer `psctl status` run from the
image, run as uid 65532, and be rooted in the image. After one epoch: test accuracy >= 0.80, both exit 0, the server wrote its final
checkpoint into the mounted directory, and every file the processes wrote belongs to 65532.

Needs root and buildah (tools/setup.sh installs it); otherwise it prints why and passes as
skipped. Containers, images and storage are removed on every exit path.
"""

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time


def runfiles_root():
    """(source root, binaries root): the runfiles tree under Bazel, else this checkout."""
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, "ps"), os.path.join(srcdir, "ps")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root, os.path.join(root, "bazel-bin")


ROOT, BIN_DIR = runfiles_root()
CONFIG = "fashion_mnist_2x2_async.textproto"
UID = 65532
TARGET = 0.80
HEALTH_CHECK = os.path.join(BIN_DIR, "tests/grpc_health_check")


def log(msg):
    sys.stdout.write("[image_e2e] %s\n" % msg)
    sys.stdout.flush()


def skip(reason):
    """Passes as skipped: prints why, and says so in the test.xml Bazel reads."""
    log("SKIPPED: " + reason)
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        reason = reason.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
        with open(xml, "w") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="image_e2e_test" '
                    'tests="1" failures="0" errors="0" skipped="1"><testcase name="ImageE2E.TrainsFromTheImage" '
                    'classname="image_e2e_test"><skipped message="%s"/></testcase></testsuite></testsuites>\n'
                    % reason)
    sys.exit(0)


class Buildah:
    """buildah on a private storage root; remove() deletes every container, image and file."""

    def __init__(self, work):
        self.work = work
        self.storage = ["--root", os.path.join(work, "storage/root"), "--runroot",
                        os.path.join(work, "storage/run"), "--storage-driver", "vfs"]
        self.env = dict(os.environ, TMPDIR=os.path.join(work, "tmp"))
        os.makedirs(self.env["TMPDIR"], exist_ok=True)

    def argv(self, *args):
        return ["buildah"] + self.storage + list(args)

    def run(self, *args):
        p = subprocess.run(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=self.env, timeout=300)
        assert p.returncode == 0, "buildah %s failed (%d):\n%s" % (" ".join(args), p.returncode, p.stdout)
        return p.stdout.strip()

    def remove(self):
        for args in (("rm", "--all"), ("rmi", "--all", "--force")):
            subprocess.run(self.argv(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
                           timeout=300)
        storage = os.path.join(self.work, "storage")
        with open("/proc/self/mounts") as f:
            for mount in [line.split()[1] for line in f if line.split()[1].startswith(storage + "/")]:
                subprocess.run(["umount", "-l", mount], stderr=subprocess.DEVNULL)


def descendants(pid):
    """The processes below pid, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def process_named(parent, name):
    """(pid, real uid, root directory) of the process `name` below `parent`, or None."""
    for pid in descendants(parent):
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().strip() != name:
                    continue
            with open("/proc/%d/status" % pid) as f:
                uid = int(re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1))
            return pid, uid, os.readlink("/proc/%d/root" % pid)
        except OSError:
            continue
    return None


def check_layer(archive, tag):
    """The archive names the image `tag`, and its one layer holds what the image promises."""
    with tarfile.open(archive) as oci:
        index = json.load(oci.extractfile("index.json"))
        (manifest_desc,) = index["manifests"]
        assert manifest_desc["annotations"]["org.opencontainers.image.ref.name"] == tag, index
        blob = lambda d: oci.extractfile("blobs/" + d["digest"].replace(":", "/"))  # noqa: E731
        manifest = json.load(blob(manifest_desc))
        config = json.load(blob(manifest["config"]))
        (layer_desc,) = manifest["layers"]
        with tarfile.open(fileobj=gzip.open(blob(layer_desc))) as layer:
            members = {m.name.lstrip("./").rstrip("/"): m for m in layer.getmembers()}
    assert config["config"]["User"] == "%d:%d" % (UID, UID), config["config"]
    for path in ("usr/local/bin/ps_server", "usr/local/bin/ps_worker", "usr/local/bin/psctl",
                 "usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", "etc/passwd", "etc/nsswitch.conf"):
        assert path in members, "%s is not in the image" % path
    for shell in ("bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/bash"):
        assert shell not in members, "the image holds a shell: %s" % shell
    assert members["var/lib/ps"].uid == UID and members["usr/local/bin/ps_server"].uid == 0
    libs = [m for m in members if re.search(r"\.so(\.|$)", m)]
    log("archive: %d files, %d shared libraries, layer %.1f MiB, user %s" % (
        len(members), len(libs), layer_desc["size"] / 2**20, config["config"]["User"]))


def check_owned(directory):
    """Every file below directory (and it) belongs to the image's user; returns how many."""
    count = 0
    for base, dirs, files in os.walk(directory):
        for name in [base] + [os.path.join(base, f) for f in files + dirs]:
            st = os.lstat(name)
            assert st.st_uid == UID, "%s belongs to uid %d, not %d" % (name, st.st_uid, UID)
            count += 1
    return count


class Job:
    """One server and one worker from the image."""

    def __init__(self, buildah, archive, work):
        self.b, self.archive, self.work = buildah, archive, work
        self.procs = {}
        self.containers = {}
        self.dirs = {}
        self.logs = {}
        # The config, copied: under Bazel configs/ holds symlinks the container cannot follow.
        self.config_dir = os.path.join(work, "config")
        os.makedirs(self.config_dir)
        shutil.copy(os.path.join(ROOT, "configs", CONFIG), self.config_dir)

    def run_argv(self, role, argv):
        """`buildah run` of argv in the role's container (made from the archive on first use)."""
        if role not in self.containers:
            self.containers[role] = self.b.run("from", "--quiet", "oci-archive:" + self.archive)
            directory = os.path.join(self.work, role)
            os.makedirs(directory)
            os.chown(directory, UID, UID)  # the host directory mounted at /var/lib/ps
            self.dirs[role] = directory
        return self.b.argv("run", "--isolation=chroot", "--volume", "%s:/etc/ps:ro" % self.config_dir,
                           "--volume", "%s:/var/lib/ps" % self.dirs[role], self.containers[role], "--") + argv

    def start(self, role, argv):
        run = self.run_argv(role, argv)
        self.logs[role] = open(os.path.join(self.work, role + ".log"), "w+")
        log("%s: %s" % (role, " ".join(run)))
        self.procs[role] = subprocess.Popen(run, stdout=self.logs[role], stderr=subprocess.STDOUT, env=self.b.env,
                                            start_new_session=True)

    def output(self, role):
        self.logs[role].flush()
        with open(self.logs[role].name) as f:
            return f.read()

    def wait_for_file(self, role, name, limit_s):
        """The file the process writes into its directory, once it is there."""
        path = os.path.join(self.dirs[role], name)
        deadline = time.monotonic() + limit_s
        while not os.path.exists(path):
            assert self.procs[role].poll() is None, "%s exited with %d before writing %s:\n%s" % (
                role, self.procs[role].returncode, name, self.output(role))
            assert time.monotonic() < deadline, "%s wrote no %s within %d s:\n%s" % (
                role, name, limit_s, self.output(role))
            time.sleep(0.1)
        with open(path) as f:
            return f.read().strip()

    def stop(self):
        for role, p in self.procs.items():
            if p.poll() is None:
                for pid in descendants(p.pid) + [p.pid]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                p.wait()
            self.logs[role].close()


def check_server_inside(job, image_user):
    """The running ps_server: uid 65532 and rooted in the container, not the host's /."""
    found = None
    deadline = time.monotonic() + 60
    while found is None and time.monotonic() < deadline:
        found = process_named(job.procs["server"].pid, "ps_server")
        if found is None:
            time.sleep(0.1)
    assert found, "no ps_server process below buildah run"
    pid, uid, root = found
    assert uid == image_user, "ps_server runs as uid %d" % uid
    assert root != "/", "ps_server's root is the host's /"
    log("ps_server pid %d: uid %d, root %s" % (pid, uid, root))


def check_health(port):
    """grpc.health.v1.Health/Check on the server, as the kubelet's grpc probe asks it."""
    p = subprocess.run([HEALTH_CHECK, "127.0.0.1:%s" % port], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert p.returncode == 0 and "SERVING" in p.stdout, "health check: %s" % p.stdout
    log("health: " + p.stdout.strip())


def check_psctl(job, port):
    """psctl from the image (in the worker's container, before the worker runs there)."""
    p = subprocess.run(job.run_argv("worker", ["psctl", "status", "--config=/etc/ps/" + CONFIG,
                                               "--servers=127.0.0.1:" + port, "--json", "--rate_interval_s=0.2"]),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job.b.env, timeout=120)
    assert p.returncode == 0, "psctl status failed (%d):\n%s%s" % (p.returncode, p.stdout, p.stderr)
    (row,) = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert row["address"] == "127.0.0.1:" + port, row
    log("psctl status from the image: %s" % json.dumps(row, sort_keys=True)[:200])


def train(b, archive, work):
    job = Job(b, archive, work)
    counts = "cluster.num_servers=1,cluster.num_workers=1,training.epochs=1"
    config = "--config=/etc/ps/" + CONFIG
    try:
        job.start("server", ["ps_server", config, "--set=" + counts, "--cluster_from=flags", "--server_index=0",
                             "--host=127.0.0.1", "--port=0", "--port_file=/var/lib/ps/port",
                             "--data_dir=/var/lib/ps/data", "--metrics_port=-1"])
        port = job.wait_for_file("server", "port", 120)
        log("server listening on 127.0.0.1:%s" % port)
        check_server_inside(job, UID)
        check_health(port)
        check_psctl(job, port)
        job.start("worker", ["ps_worker", config, "--set=" + counts, "--cluster_from=flags", "--worker_index=0",
                             "--servers=127.0.0.1:" + port, "--log_path=/var/lib/ps/train.jsonl",
                             "--metrics_port=-1", "--wait_for_servers_s=60"])
        codes = {role: job.procs[role].wait(timeout=600) for role in ("worker", "server")}
        out = {role: job.output(role) for role in codes}
        for role in codes:
            sys.stdout.write("---- %s ----\n%s" % (role, out[role]))
        assert codes == {"worker": 0, "server": 0}, "exit codes %s" % codes
        accuracy = [float(a) for a in re.findall(r"^final test accuracy ([0-9.]+)", out["worker"], re.M)]
        assert accuracy, "the worker printed no final test accuracy"
        assert accuracy[-1] >= TARGET, "test accuracy %.4f < %.2f" % (accuracy[-1], TARGET)
        checkpoint = re.search(r"final checkpoint (\d+)", out["server"])
        assert checkpoint, "the server wrote no final checkpoint"
        data = os.path.join(job.dirs["server"], "data")
        assert os.path.isdir(data) and os.listdir(data), "nothing in the mounted data dir"
        assert os.path.getsize(os.path.join(job.dirs["worker"], "train.jsonl")) > 0, "the worker wrote no log"
        files = check_owned(job.dirs["server"]) + check_owned(job.dirs["worker"])
        log("test accuracy %.4f, final checkpoint %s in the mounted dir (%s); %d files written, all uid %d" % (
            accuracy[-1], checkpoint.group(1), ", ".join(sorted(os.listdir(data))[:4]), files, UID))
    finally:
        job.stop()


def main():
    if shutil.which("buildah") is None:
        skip("buildah not found (tools/setup.sh installs it)")
    if os.geteuid() != 0:
        skip("needs root (buildah run --isolation=chroot and a private storage root)")
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="ps-image-e2e-", dir=os.environ.get("TEST_TMPDIR"))
    os.chmod(work, 0o755)  # the image's user reaches its mounted directories through it
    b = Buildah(work)

    def on_term(signum, _frame):
        raise SystemExit("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        archive = os.path.join(work, "ps-image.tar")
        tag = subprocess.run(["bash", os.path.join(ROOT, "tools/build_image.sh"), "--with-data", "--print-tag"],
                             stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
        p = subprocess.run(["bash", os.path.join(ROOT, "tools/build_image.sh"), "--with-data", "--bin_dir", BIN_DIR,
                            "--out", archive] + b.storage[:4], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=b.env, timeout=600)
        sys.stdout.write(p.stdout)
        assert p.returncode == 0, "build_image.sh failed"
        assert re.search(r"-> %s \(\d+ MiB" % re.escape(archive), p.stdout), "build_image.sh printed no size"
        assert tag in b.run("images", "--format", "{{.Name}}:{{.Tag}}").split(), "no local image %s" % tag
        log("built %s in %.0f s" % (tag, time.monotonic() - start))
        check_layer(archive, tag)
        train(b, archive, work)
        log("PASSED in %.0f s" % (time.monotonic() - start))
        return 0
    finally:
        b.remove()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
