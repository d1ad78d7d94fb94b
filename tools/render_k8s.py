#!/usr/bin/env python3
"""Kubernetes manifests for a job, from its JobConfig.

    tools/render_k8s.py configs/fashion_mnist_2x2_async.textproto [--image NAME:TAG] --out DIR
    kubectl apply -f DIR/configmap.yaml -f DIR/servers.yaml -f DIR/workers.yaml

Writes into --out (or prints to stdout):
    configmap.yaml  the config as ConfigMap NAME-config (key job.textproto, mounted at /etc/ps)
    servers.yaml    headless Service NAME-server and StatefulSet NAME-server: cluster.num_servers
                    ps_server pods; server i = pod NAME-server-i (its index from the pod's label
                    apps.kubernetes.io/pod-index, Kubernetes 1.28+), with a PersistentVolumeClaim
                    each for its RocksDB checkpoints, ready when grpc.health.v1 says SERVING
    workers.yaml    Indexed Job NAME-worker: cluster.num_workers ps_worker pods, worker i =
                    completion index i, given the servers' stable DNS names
    tfjob.yaml      the same job as a Kubeflow TFJob (PS and Worker replicas); the binaries take
                    their index and the servers' addresses from TF_CONFIG (--cluster_from=tf_config)

NAME is the config's `name`. The image is the one tools/build_image.sh builds: ps_server and
ps_worker on its PATH, user 65532 (every pod runs as it, without privileges; the servers' volumes
get it as fsGroup), and every file the config names. The default --image is the script's tag,
with its -fashion-mnist variant (built --with-data) for a config that reads Fashion-MNIST from
Debian's dataset-fashion-mnist. No shell is needed. The servers run with --exit_when_done=false: when the Job has
completed, `kubectl delete statefulset NAME-server` stops them, and each writes a final
checkpoint to its volume within terminationGracePeriodSeconds (which is sized from the model:
60 s, or 30 s plus the biggest server's share of parameters and optimizer slots at 20 MiB/s).
"""

import argparse
import json
import math
import os
import re
import sys

from launch_common import effective_config, get

CONFIG_DIR = "/etc/ps"
CONFIG_KEY = "job.textproto"
DATA_MOUNT = "/var/lib/ps"
DATA_DIR = DATA_MOUNT + "/data"  # a subdirectory: a fresh volume's root may hold lost+found
OPTIMIZER_SLOTS = {"SGD": 0, "MOMENTUM": 1, "ADAGRAD": 1, "ADAM": 2, "FTRL": 2}
CHECKPOINT_BYTES_PER_S = 20 << 20
# tools/build_image.sh's image (--print-tag), and the user it runs as.
IMAGE = "localhost/ps:0.1"
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist/"
IMAGE_USER = 65532


# ---- YAML -----------------------------------------------------------------------------------

# Plain (unquoted) only when no YAML 1.1 or 1.2 reader could take the text for anything but a
# string: no number-like start, no indicator characters, no reserved word.
_PLAIN = re.compile(r"^(?![-+.]?[0-9])[A-Za-z0-9_/$.-][A-Za-z0-9_./$()=:,@+-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if _PLAIN.fullmatch(v) and not v.endswith(":") and v not in ("-", ".") and v.lower() not in _RESERVED:
        return v
    return json.dumps(v)  # a JSON string is a valid YAML double-quoted scalar


def _block(text, indent):
    """A multi-line string as a YAML literal block."""
    chomp = "+" if text.endswith("\n\n") else ("" if text.endswith("\n") else "-")
    head = "|" + ("2" if text[:1] in (" ", "\n") else "") + chomp
    pad = " " * indent
    body = "".join((pad + line if line else "") + "\n" for line in text.rstrip("\n").split("\n"))
    return head + "\n" + body + ("\n" * (len(text) - len(text.rstrip("\n")) - 1) if chomp == "+" else "")


def to_yaml(v, indent=0):
    """YAML of JSON-like data: block mappings and sequences, literal blocks for multi-line text."""
    pad = " " * indent
    out = []
    if isinstance(v, dict):
        for k, item in v.items():
            if isinstance(item, (dict, list)) and item:
                child = to_yaml(item, indent + (0 if isinstance(item, list) else 2))
                out.append("%s%s:\n%s" % (pad, _scalar(k), child))
            elif isinstance(item, str) and "\n" in item:
                out.append("%s%s: %s" % (pad, _scalar(k), _block(item, indent + 2)))
            else:
                out.append("%s%s: %s\n" % (pad, _scalar(k), _inline(item)))
    else:
        for item in v:
            if isinstance(item, (dict, list)) and item:
                child = to_yaml(item, indent + 2)
                out.append("%s- %s" % (pad, child[indent + 2:]))
            else:
                out.append("%s- %s\n" % (pad, _inline(item)))
    return "".join(out)


def _inline(v):
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return _scalar(v)


def documents_yaml(docs):
    return "---\n".join(to_yaml(d) for d in docs)


# ---- The job --------------------------------------------------------------------------------

def dns_name(text):
    """A DNS-1123 label from a job name: lower case, [a-z0-9-], at most 40 characters (room for
    the -server-N / -worker-N-xxxxx suffixes Kubernetes adds)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].strip("-")
    return name or "ps-job"


def dense_shapes(config):
    """(name, number of values, optimizer kind) of every dense table of an effective config
    (the model's tables are among them)."""
    default_opt = get(config, "default_optimizer.kind", "SGD")
    return [(t["name"], math.prod(int(d) for d in t.get("shape", [0])), get(t, "optimizer.kind", default_opt))
            for t in config.get("tables", []) if t.get("kind", "TABLE_KIND_DENSE") == "TABLE_KIND_DENSE"]


def sparse_bytes(config):
    """Bytes of the sparse tables, where the config bounds their rows; None if it does not."""
    default_opt = get(config, "default_optimizer.kind", "SGD")
    sparse = [(int(t.get("dim", 0)), get(t, "optimizer.kind", default_opt))
              for t in config.get("tables", []) if t.get("kind") == "TABLE_KIND_SPARSE"]
    if not sparse:
        return 0
    rows = int(get(config, "model.ctr.hash_buckets", 0))
    if not rows and get(config, "data.format") == "SYNTHETIC_CTR":
        rows = int(get(config, "data.synthetic.num_fields", 0)) * int(get(config, "data.synthetic.vocabulary_per_field", 0))
    if not rows:
        return None
    return sum(rows * (dim * 4 * (1 + OPTIMIZER_SLOTS.get(opt, 2)) + 16) for dim, opt in sparse)


def sizing(config, num_servers):
    """(terminationGracePeriodSeconds, storage request) that fit the biggest server's checkpoint."""
    dense = sum(n * 4 * (1 + OPTIMIZER_SLOTS.get(opt, 2)) for _, n, opt in dense_shapes(config))
    sparse = sparse_bytes(config)
    if sparse is None:
        return 300, "10Gi"  # rows unbounded by the config: room for a large table
    # Dense tables are cut into blocks spread over servers; a server holds at most its share
    # rounded up by a block, and sparse rows hash evenly.
    block = int(get(config, "cluster.dense_block_floats", 65536)) * 4 * 3
    per_server = dense / num_servers + block + sparse / num_servers
    grace = max(60, int(math.ceil((30 + per_server / CHECKPOINT_BYTES_PER_S) / 10.0)) * 10)
    keep = int(get(config, "checkpoint.keep", 2))
    gib = max(1, int(math.ceil(per_server * (keep + 1) * 2 / (1 << 30))))
    return grace, "%dGi" % gib


class Job:
    def __init__(self, args, config_text, config):
        """config_text: the file as it is (the ConfigMap holds it); config: its effective_config
        with the --set overrides applied."""
        self.args = args
        self.config_text = config_text
        self.config = config
        self.name = dns_name(args.name or get(config, "name", "job"))
        self.num_servers = args.servers or int(get(config, "cluster.num_servers", 0)) or len(
            get(config, "cluster.servers", [])) or 1
        self.num_workers = args.workers or int(get(config, "cluster.num_workers", 1))
        self.port = args.port
        self.metrics_port = int(get(config, "metrics.port", -1))
        grace, storage = sizing(config, self.num_servers)
        self.grace = args.grace_s or grace
        self.storage = args.storage or storage
        self.servers_name = self.name + "-server"
        self.configmap = self.name + "-config"
        suffix = ".%s.svc" % args.namespace if args.namespace else ""
        self.server_addresses = ["%s-%d.%s%s:%d" % (self.servers_name, i, self.servers_name, suffix, self.port)
                                 for i in range(self.num_servers)]
        overrides = list(args.set) + ["cluster.num_servers=%d" % self.num_servers,
                                      "cluster.num_workers=%d" % self.num_workers]
        self.set_flag = "--set=" + ",".join(overrides)
        self.image = args.image or default_image(config)

    def labels(self, component):
        return {"app.kubernetes.io/name": "ps", "app.kubernetes.io/instance": self.name,
                "app.kubernetes.io/component": component}

    def metadata(self, name, component):
        meta = {"name": name}
        if self.args.namespace:
            meta["namespace"] = self.args.namespace
        meta["labels"] = self.labels(component)
        return meta

    def config_volume(self):
        return {"name": "config", "configMap": {"name": self.configmap}}

    def config_mount(self):
        return {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}

    def ports(self, grpc_name):
        ports = [{"name": grpc_name, "containerPort": self.port, "protocol": "TCP"}]
        if self.metrics_port > 0:
            ports.append({"name": "metrics", "containerPort": self.metrics_port, "protocol": "TCP"})
        return ports

    def server_container(self, name, command, grpc_name):
        return {
            "name": name,
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "command": command,
            "ports": self.ports(grpc_name),
            "readinessProbe": self.readiness_probe(),
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": [self.config_mount(), {"name": "data", "mountPath": DATA_MOUNT}],
        }

    def readiness_probe(self):
        # The servers serve grpc.health.v1.Health: SERVING once they take calls, NOT_SERVING
        # while they drain on SIGTERM. The kubelet's gRPC probe speaks plaintext only: with
        # TLS (the servers' one listener) it could never pass, so there the probe is that the
        # port takes connections.
        if get(self.config, "security.plaintext") is True:
            probe = {"grpc": {"port": self.port}}
        else:
            probe = {"tcpSocket": {"port": self.port}}
        return dict(probe, periodSeconds=5, failureThreshold=2)

    def config_flag(self):
        return "--config=%s/%s" % (CONFIG_DIR, CONFIG_KEY)

    def server_flags(self):
        return [self.config_flag(), "--port=%d" % self.port, "--data_dir=" + DATA_DIR]

    def configmap_doc(self):
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.metadata(self.configmap, "config"),
                "data": {CONFIG_KEY: self.config_text}}

    def servers_docs(self):
        labels = self.labels("server")
        service = {
            "apiVersion": "v1", "kind": "Service", "metadata": self.metadata(self.servers_name, "server"),
            "spec": {
                "clusterIP": "None",
                # Workers wait for the servers themselves; their names resolve from the start.
                "publishNotReadyAddresses": True,
                "selector": labels,
                "ports": [{"name": "grpc", "port": self.port, "targetPort": "grpc", "protocol": "TCP"}],
            },
        }
        # Server i is pod NAME-server-i: the StatefulSet labels it with its ordinal, which
        # Kubernetes expands into the command as $(POD_INDEX) (the image has no shell).
        server = self.server_container("ps-server", ["ps_server", "--server_index=$(POD_INDEX)", "--cluster_from=flags"]
                                       + self.server_flags() + ["--exit_when_done=false", self.set_flag], "grpc")
        server["env"] = [{"name": "POD_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}}]
        template_meta = {"labels": labels}
        if self.metrics_port > 0:
            template_meta["annotations"] = {"prometheus.io/scrape": "true",
                                            "prometheus.io/port": str(self.metrics_port)}
        statefulset = {
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": self.metadata(self.servers_name, "server"),
            "spec": {
                "serviceName": self.servers_name,
                "replicas": self.num_servers,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": template_meta,
                    "spec": {
                        # SIGTERM: drain, then the final checkpoint into the volume.
                        "terminationGracePeriodSeconds": self.grace,
                        "securityContext": pod_security(),
                        "containers": [server],
                        "volumes": [self.config_volume()],
                    },
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data", "labels": labels},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": self.storage}}},
                }],
            },
        }
        return [service, statefulset]

    def workers_doc(self):
        labels = self.labels("worker")
        return {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": self.metadata(self.name + "-worker", "worker"),
            "spec": {
                "completionMode": "Indexed",
                "completions": self.num_workers,
                "parallelism": self.num_workers,
                # A failed worker restarts in its pod and resumes where the servers saw it last.
                "backoffLimit": 3 * self.num_workers,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "OnFailure",
                        "securityContext": pod_security(),
                        "containers": [{
                            "name": "ps-worker",
                            "image": self.image,
                            "imagePullPolicy": "IfNotPresent",
                            # Kubernetes expands $(JOB_COMPLETION_INDEX), which the Job sets.
                            "command": ["ps_worker", self.config_flag(),
                                        "--worker_index=$(JOB_COMPLETION_INDEX)",
                                        "--cluster_from=flags",
                                        "--servers=" + ",".join(self.server_addresses),
                                        "--wait_for_servers_s=%d" % self.args.wait_for_servers_s, self.set_flag],
                            **({"ports": self.ports("metrics")[1:]} if self.metrics_port > 0 else {}),
                            "securityContext": CONTAINER_SECURITY,
                            "volumeMounts": [self.config_mount()],
                        }],
                        "volumes": [self.config_volume()],
                    },
                },
            },
        }

    def tfjob_doc(self):
        def replica(count, container, extra_volumes, grace=None):
            spec = {"securityContext": pod_security(), "containers": [container],
                    "volumes": [self.config_volume()] + extra_volumes}
            if grace:
                spec = {"terminationGracePeriodSeconds": grace, **spec}
            return {"replicas": count, "restartPolicy": "OnFailure",
                    "template": {"metadata": {"labels": self.labels(container["name"])}, "spec": spec}}

        # The training operator runs the container named tensorflow and builds TF_CONFIG from
        # the port named tfjob-port: each server listens on the port of its own TF_CONFIG entry,
        # and exits by itself once every worker has finished.
        ps = self.server_container("tensorflow", ["ps_server", "--cluster_from=tf_config", self.config_flag(),
                                                  "--data_dir=" + DATA_DIR, self.set_flag], "tfjob-port")
        worker = {"name": "tensorflow", "image": self.image, "imagePullPolicy": "IfNotPresent",
                  "command": ["ps_worker", "--cluster_from=tf_config", self.config_flag(),
                              "--wait_for_servers_s=%d" % self.args.wait_for_servers_s, self.set_flag],
                  "securityContext": CONTAINER_SECURITY, "volumeMounts": [self.config_mount()]}
        meta = self.metadata(self.name, "tfjob")
        return {
            "apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": meta,
            "spec": {
                "runPolicy": {"cleanPodPolicy": "None"},
                "tfReplicaSpecs": {
                    # A TFJob has no volume claim templates: the PS checkpoints live as long as the pod.
                    "PS": replica(self.num_servers, ps, [{"name": "data", "emptyDir": {}}], self.grace),
                    "Worker": replica(self.num_workers, worker, []),
                },
            },
        }

    def files(self):
        sets = "".join(" --set " + o for o in self.args.set)
        header = "# Rendered by tools/render_k8s.py from %s%s; do not edit by hand.\n" % (self.args.config_label, sets)
        return {
            "configmap.yaml": header + documents_yaml([self.configmap_doc()]),
            "servers.yaml": header + documents_yaml(self.servers_docs()),
            "workers.yaml": header + documents_yaml([self.workers_doc()]),
            "tfjob.yaml": header + "# Needs the Kubeflow training operator, and the ConfigMap of configmap.yaml.\n"
                          + documents_yaml([self.tfjob_doc()]),
        }


# Every container: the image's user, no privileges.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security():
    """Every pod runs as the image's user; volumes (the servers' checkpoints) are group-owned by it."""
    return {"runAsNonRoot": True, "runAsUser": IMAGE_USER, "runAsGroup": IMAGE_USER, "fsGroup": IMAGE_USER}


def default_image(config):
    """The image tools/build_image.sh tags: with Fashion-MNIST baked in when the config reads it."""
    paths = [get(config, "data." + f, "") for f in ("train_images", "train_labels", "test_images", "test_labels")]
    if any(p.startswith(FASHION_MNIST_DIR) for p in paths):
        return IMAGE + "-fashion-mnist"
    return IMAGE


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the job's JobConfig textproto")
    ap.add_argument("--image", default=None, help="container image with ps_server, ps_worker and the data (default: "
                    "tools/build_image.sh's, %s or %s-fashion-mnist)" % (IMAGE, IMAGE))
    ap.add_argument("--out", default=None, help="write the manifests into this directory (default: stdout)")
    ap.add_argument("--namespace", default=None, help="namespace of every object (default: none, kubectl's)")
    ap.add_argument("--name", default=None, help="object name prefix (default: the config's name)")
    ap.add_argument("--servers", type=int, help="number of servers (default: cluster.num_servers)")
    ap.add_argument("--workers", type=int, help="number of workers (default: cluster.num_workers)")
    ap.add_argument("--port", type=int, default=7000, help="the servers' gRPC port")
    ap.add_argument("--set", action="append", default=[], help="config override path=value, for every process")
    ap.add_argument("--grace_s", type=int, default=0, help="terminationGracePeriodSeconds of servers (default: sized)")
    ap.add_argument("--storage", default=None, help="each server's volume size, e.g. 5Gi (default: sized)")
    ap.add_argument("--wait_for_servers_s", type=int, default=600, help="how long workers wait for servers")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--bin_dir", default=os.path.join(root, "bazel-bin"),
                    help="where server/ps_server is: it reads the config as the servers will (default: bazel-bin)")
    args = ap.parse_args()
    if not os.access(os.path.join(args.bin_dir, "server", "ps_server"), os.X_OK):
        sys.exit("render_k8s: %s/server/ps_server not found; build it: bazel build //server:ps_server" % args.bin_dir)
    try:
        text = open(args.config).read()
    except OSError as e:
        sys.exit("render_k8s: %s" % e)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.abspath(args.config)
    args.config_label = os.path.relpath(path, root) if path.startswith(root + os.sep) else os.path.basename(path)
    try:
        job = Job(args, text, effective_config(args.bin_dir, args.config, args.set))
    except RuntimeError as e:
        sys.exit("render_k8s: %s: %s" % (args.config, e))
    if get(job.config, "security.plaintext") is not True:
        sys.stderr.write("render_k8s: the config uses TLS: its certificate files must be in the image or mounted "
                         "at the same paths, and the server certificate must name %s\n" % ", ".join(
                             a.rsplit(":", 1)[0] for a in job.server_addresses))
    files = job.files()
    if args.out is None:
        sys.stdout.write("---\n".join(files[f] for f in ("configmap.yaml", "servers.yaml", "workers.yaml")))
        return 0
    os.makedirs(args.out, exist_ok=True)
    for name, content in files.items():
        with open(os.path.join(args.out, name), "w") as f:
            f.write(content)
    print("render_k8s: wrote %s into %s" % (", ".join(sorted(files)), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
