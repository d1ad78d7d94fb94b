#!/usr/bin/env python3
"""tools/render_k8s.py: the manifests are valid Kubernetes objects and describe the config's job.

Renders configs/fashion_mnist_2x2_async.textproto (as committed under deploy/k8s/, which must be
current) and configs/ctr_synthetic_2x2.textproto with other counts, namespace and port;
validates every object offline with tests/k8s_validate.js (kubernetes-models: the Kubernetes
API schema, strict about unknown fields; the TFJob by its API structure); checks that the
cluster matches the config (replicas, the servers' DNS names in the workers' arguments, ports,
config volume); that every pod runs tools/build_image.sh's image (its tag, with or without the
data as the config needs) as its non-root user, without a shell; and checks that the validator
rejects broken objects.

Needs node and the npm packages kubernetes-models and yaml (tools/setup.sh installs them).
"""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

SRCDIR = os.path.join(os.environ["TEST_SRCDIR"], "ps") if "TEST_SRCDIR" in os.environ else \
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRCDIR, "tools"))
from launch_common import effective_config, get  # noqa: E402

MLP = "configs/fashion_mnist_2x2_async.textproto"
CTR = "configs/ctr_synthetic_2x2.textproto"
FILES = ("configmap.yaml", "servers.yaml", "workers.yaml", "tfjob.yaml")
IMAGE_USER = 65532  # the user tools/build_image.sh's image runs as
COMMITTED_FLAGS = ("--set", "metrics.port=9100")  # deploy/k8s/ (see deploy/k8s/BUILD)
TMP = tempfile.mkdtemp(prefix="k8s-test-", dir=os.environ.get("TEST_TMPDIR"))


def render(config, out, *flags):
    p = subprocess.run([sys.executable, os.path.join(SRCDIR, "tools/render_k8s.py"), os.path.join(SRCDIR, config),
                        "--out", out, "--bin_dir", SRCDIR] + list(flags), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, "render_k8s.py %s failed:\n%s" % (config, p.stdout)
    return out


def node_modules():
    """The global node_modules that holds kubernetes-models and yaml."""
    candidates = []
    npm = shutil.which("npm")
    if npm:
        env = dict(os.environ, HOME=TMP, npm_config_update_notifier="false")
        p = subprocess.run([npm, "root", "-g"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        candidates.append(p.stdout.strip())
    candidates += ["/usr/local/lib/node_modules", "/usr/lib/node_modules"]
    for c in candidates:
        if c and all(os.path.isdir(os.path.join(c, m)) for m in ("kubernetes-models", "yaml")):
            return c
    raise AssertionError("node packages kubernetes-models and yaml not found (looked in %s); "
                         "run: bash tools/setup.sh" % ", ".join(c for c in candidates if c))


def validate(files, json_out=None):
    """Runs the validator; returns (exit code, {file: output line})."""
    node = shutil.which("node")
    assert node, "node not found; run: bash tools/setup.sh"
    argv = [node, os.path.join(SRCDIR, "tests/k8s_validate.js")] + (["--json", json_out] if json_out else []) + files
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, NODE_PATH=node_modules()))
    lines = {}
    for line in p.stdout.splitlines():
        m = re.match(r"^(ok|invalid) (\S+)", line)
        assert m, "unexpected validator output: %r\n%s" % (line, p.stdout)
        lines.setdefault(m.group(2), []).append(line)
    return p.returncode, lines, p.stdout


def load(out_dir):
    """Validates a rendered directory; returns its objects by kind."""
    files = [os.path.join(out_dir, f) for f in FILES]
    dump = os.path.join(out_dir, "objects.json")
    code, lines, text = validate(files, dump)
    assert code == 0, "the validator rejected rendered manifests:\n" + text
    print(text, end="")
    objects = {}
    for entry in json.load(open(dump)):
        objects.setdefault(entry["doc"]["kind"], []).append(entry["doc"])
    for kind in ("ConfigMap", "Service", "StatefulSet", "Job", "TFJob"):
        assert len(objects.get(kind, [])) == 1, "expected one %s, got %d" % (kind, len(objects.get(kind, [])))
    return {k: v[0] for k, v in objects.items()}


def flag(argv, name):
    values = [a.split("=", 1)[1] for a in argv if a.startswith("--%s=" % name)]
    assert len(values) == 1, "expected one --%s in %s" % (name, argv)
    return values[0]


def check_cluster(objs, config_path, servers, workers, port, namespace=None):
    """The rendered objects describe the config's cluster."""
    config_text = open(os.path.join(SRCDIR, config_path)).read()
    cm, svc, sts, job, tf = (objs[k] for k in ("ConfigMap", "Service", "StatefulSet", "Job", "TFJob"))
    assert cm["data"]["job.textproto"] == config_text, "the ConfigMap does not hold the config as it is"
    for o in objs.values():
        assert o["metadata"].get("namespace") == namespace, "%s namespace" % o["kind"]

    # Servers: a headless Service in front of a StatefulSet of `servers` pods, one volume each.
    assert sts["spec"]["replicas"] == servers, "StatefulSet replicas %s != %d" % (sts["spec"]["replicas"], servers)
    assert svc["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"] == labels
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "Service selects no server pod"
    (server,) = pod["spec"]["containers"]
    server_argv = server["command"]
    assert server_argv[0] == "ps_server"
    assert flag(server_argv, "port") == str(port)
    # The pod's ordinal, from the label the StatefulSet sets, expanded by Kubernetes (no shell).
    assert flag(server_argv, "server_index") == "$(POD_INDEX)"
    (index_env,) = [e for e in server["env"] if e["name"] == "POD_INDEX"]
    assert index_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert server["ports"][0]["containerPort"] == port and server["ports"][0]["name"] == "grpc"
    assert svc["spec"]["ports"][0]["port"] == port and svc["spec"]["ports"][0]["targetPort"] == "grpc"
    assert server["readinessProbe"]["grpc"]["port"] == port, "readiness probe on another port"
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    data_mount = [m for m in server["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert data_mount and flag(server_argv, "data_dir").startswith(data_mount[0]["mountPath"] + "/")
    check_config_volume(pod["spec"], server, server_argv, cm)

    # Workers: an Indexed Job of `workers` pods, given every server's stable DNS name in order.
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == workers and spec["parallelism"] == workers, "Job completions/parallelism"
    (worker,) = spec["template"]["spec"]["containers"]
    assert worker["command"][0] == "ps_worker"
    assert flag(worker["command"], "worker_index") == "$(JOB_COMPLETION_INDEX)"
    domain = ".%s.svc" % namespace if namespace else ""
    expected = ["%s-%d.%s%s:%d" % (sts["metadata"]["name"], i, svc["metadata"]["name"], domain, port)
                for i in range(servers)]
    assert flag(worker["command"], "servers").split(",") == expected, "worker --servers %s != %s" % (
        flag(worker["command"], "servers"), expected)
    check_config_volume(spec["template"]["spec"], worker, worker["command"], cm)
    counts = "cluster.num_servers=%d,cluster.num_workers=%d" % (servers, workers)
    for argv in (server_argv, worker["command"]):
        assert flag(argv, "set").endswith(counts), "--set lacks %s" % counts

    # The TFJob: PS and Worker replicas, cluster from TF_CONFIG on the port named tfjob-port.
    replicas = tf["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"PS", "Worker"}
    assert replicas["PS"]["replicas"] == servers and replicas["Worker"]["replicas"] == workers
    for kind in ("PS", "Worker"):
        (c,) = replicas[kind]["template"]["spec"]["containers"]
        assert c["name"] == "tensorflow" and "--cluster_from=tf_config" in c["command"]
        check_config_volume(replicas[kind]["template"]["spec"], c, c["command"], cm)
    check_runs_as_image_user([pod["spec"], spec["template"]["spec"]]
                             + [replicas[k]["template"]["spec"] for k in ("PS", "Worker")])
    (ps,) = replicas["PS"]["template"]["spec"]["containers"]
    # TF_CONFIG carries the port named tfjob-port; the server listens on its own entry's port.
    assert [p["containerPort"] for p in ps["ports"] if p["name"] == "tfjob-port"] == [port]
    assert ps["readinessProbe"]["grpc"]["port"] == port
    assert not [a for a in ps["command"] if a.startswith("--port=")], "--port would compete with TF_CONFIG"


def check_runs_as_image_user(pod_specs):
    """Every pod runs as the image's non-root user, unprivileged, and starts no shell."""
    for spec in pod_specs:
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == IMAGE_USER, security
        assert security["fsGroup"] == IMAGE_USER, "the volumes would not be writable by the image's user"
        for c in spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert os.path.basename(c["command"][0]) in ("ps_server", "ps_worker"), c["command"]


def image_tag(*flags):
    """The NAME:TAG tools/build_image.sh gives its image."""
    p = subprocess.run(["bash", os.path.join(SRCDIR, "tools/build_image.sh"), "--print-tag"] + list(flags),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, "build_image.sh --print-tag: %s" % p.stdout
    return p.stdout.strip()


def images(objs):
    """The image of every container."""
    tf = objs["TFJob"]["spec"]["tfReplicaSpecs"]
    specs = [objs["StatefulSet"]["spec"]["template"]["spec"], objs["Job"]["spec"]["template"]["spec"]] + [
        tf[k]["template"]["spec"] for k in ("PS", "Worker")]
    return {c["image"] for spec in specs for c in spec["containers"]}


def check_config_volume(pod_spec, container, argv, cm):
    """--config names the ConfigMap's key in a volume of that ConfigMap."""
    (volume,) = [v for v in pod_spec["volumes"] if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert flag(argv, "config") == mount["mountPath"] + "/job.textproto"


def test_mlp_manifests_are_valid_and_match_the_config():
    config = effective_config(SRCDIR, os.path.join(SRCDIR, MLP), [])
    objs = load(render(MLP, os.path.join(TMP, "mlp")))
    check_cluster(objs, MLP, get(config, "cluster.num_servers"), get(config, "cluster.num_workers"), 7000)
    # The image tools/build_image.sh builds --with-data: the config reads Fashion-MNIST.
    assert images(objs) == {image_tag("--with-data")}, images(objs)


def test_default_image_without_data():
    """A config that reads no Fashion-MNIST files gets the image without the data."""
    objs = load(render(CTR, os.path.join(TMP, "ctr-default")))
    assert images(objs) == {image_tag()}, images(objs)


def test_committed_manifests_are_current():
    rendered = os.path.join(TMP, "mlp-committed")
    render(MLP, rendered, *COMMITTED_FLAGS)
    for f in FILES:
        committed = open(os.path.join(SRCDIR, "deploy/k8s", f)).read()
        assert committed == open(os.path.join(rendered, f)).read(), (
            "deploy/k8s/%s is out of date: tools/render_k8s.py %s %s --out deploy/k8s" % (
                f, MLP, " ".join(COMMITTED_FLAGS)))


def test_other_counts_namespace_and_port():
    out = render(CTR, os.path.join(TMP, "ctr"), "--servers", "3", "--workers", "4", "--namespace", "ml",
                 "--port", "7100", "--image", "registry.local/ps:1", "--set", "metrics.port=9100")
    objs = load(out)
    check_cluster(objs, CTR, 3, 4, 7100, namespace="ml")
    # --set metrics.port: the pods declare the port, and the servers are marked for scraping.
    server_pod = objs["StatefulSet"]["spec"]["template"]
    worker = objs["Job"]["spec"]["template"]["spec"]["containers"][0]
    for c in (server_pod["spec"]["containers"][0], worker):
        assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in c["ports"], c["ports"]
    assert server_pod["metadata"]["annotations"]["prometheus.io/port"] == "9100"
    assert images(objs) == {"registry.local/ps:1"}, images(objs)


def test_tls_servers_are_probed_by_their_port_not_grpc_health():
    # The kubelet's gRPC probe speaks plaintext: against a TLS server's one listener it never
    # passed, and the servers never became Ready (a grpc probe before 2026-12-05).
    out = render(MLP, os.path.join(TMP, "tls"), "--set",
                 "security.plaintext=false,security.cert=/certs/server.pem,security.key=/certs/server.key,"
                 "security.ca_cert=/certs/ca.pem")
    objs = load(out)
    probe = objs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert "grpc" not in probe, probe
    assert probe["tcpSocket"]["port"] == 7000, probe


def test_validator_rejects_broken_objects():
    objs = load(render(MLP, os.path.join(TMP, "broken-base")))
    broken = {}

    def variant(name, kind, mutate):
        o = copy.deepcopy(objs[kind])
        mutate(o)
        path = os.path.join(TMP, "broken-%s.yaml" % name)
        json.dump(o, open(path, "w"))  # JSON is YAML
        broken[path] = name

    def misspell_probe(o):
        c = o["spec"]["template"]["spec"]["containers"][0]
        c["readinesProbe"] = c.pop("readinessProbe")

    def bad_tfjob(o):
        r = o["spec"]["tfReplicaSpecs"]
        r["Parameter"] = r.pop("PS")
        r["Worker"]["template"]["spec"]["containers"][0]["name"] = "worker"

    variant("replicas", "StatefulSet", lambda o: o["spec"].update(replicas="two"))
    variant("unknown-field", "StatefulSet", misspell_probe)
    variant("no-template", "Job", lambda o: o["spec"].pop("template"))
    variant("completion-mode", "Job", lambda o: o["spec"].update(completionMode="Numbered"))
    variant("top-level", "Job", lambda o: o.update(specs=o["spec"]))
    variant("port", "Service", lambda o: o["spec"]["ports"][0].update(port="grpc"))
    variant("tfjob", "TFJob", bad_tfjob)
    expected = {
        "replicas": "/spec/replicas must be integer",
        "unknown-field": "/spec/template/spec/containers/0/readinesProbe: unknown field",
        "no-template": "/spec must have required property",
        "completion-mode": "/spec/completionMode must be equal to one of the allowed values",
        "top-level": "/specs: unknown field",
        "port": "/spec/ports/0/port must be integer",
        "tfjob": "replica type must be one of",
    }
    code, lines, text = validate(sorted(broken))
    print(text, end="")
    assert code == 1, "the validator accepted broken objects (exit %d)" % code
    for path, name in broken.items():
        out = " ".join(lines.get(path, []))
        assert out.startswith("invalid"), "broken object %s passed: %s" % (name, out)
        assert expected[name] in out, "broken object %s: expected %r in %r" % (name, expected[name], out)
    assert 'needs a container named "tensorflow"' in text


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    results = []
    for name, fn in tests:
        try:
            fn()
            results.append((name, None))
            print("PASS %s" % name)
        except Exception:  # noqa: BLE001 -- every failure is reported, then the next test runs
            results.append((name, traceback.format_exc()))
            print("FAIL %s\n%s" % (name, results[-1][1]))
    failed = [n for n, err in results if err]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        cases = "".join('<testcase name="%s" classname="k8s_manifests_test">%s</testcase>' % (
            n, '<failure message="%s"/>' % esc(err.strip().splitlines()[-1]) if err else "") for n, err in results)
        with open(xml, "w") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="k8s_manifests_test" '
                    'tests="%d" failures="%d">%s</testsuite></testsuites>\n' % (len(results), len(failed), cases))
    print("k8s_manifests_test: %d of %d passed" % (len(results) - len(failed), len(results)))
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
