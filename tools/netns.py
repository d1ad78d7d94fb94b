"""Hosts on one machine: network namespaces joined by veth pairs to a bridge, links shaped by tbf.

    from netns import Network, check_netns
    net = Network(os.getpid(), [("s0", 1), ("w0", 3)], tag="ps")
    net.create("1gbit")          # or "" for unshaped links
    ... run processes with `ip netns exec net.ns("s0") ...`, reach them at net.addr("s0") ...
    net.shape("100mbit")         # change every link's rate in place ("" = remove the shaping)
    Network.remove(os.getpid(), tag="ps")

Each host is a namespace PREFIX-PID-HOST with the address SUBNET.OCTET/24 on its eth0, whose
peer (the host's "cable") is enslaved to a bridge with no address, so nothing reaches the
machine's own network. Shaping puts a tbf qdisc on both ends of every cable: the bridge end
limits what enters the host, eth0 what leaves it. Every name carries the owner's pid, so
concurrent users (tests/netns_e2e_test.py, studies/crossover_study.py) never collide, and
remove_stale() clears what a killed run left behind. Needs root, `ip` and `tc` (iproute2).
The kernel needs no netem: links get a rate, not a delay.
"""

import os
import re
import shutil
import signal
import subprocess


def sh(*argv, check=True):
    """Runs argv; returns the CompletedProcess (stdout and stderr together in .stdout)."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(argv), p.returncode, p.stdout.strip()))
    return p


def rate_bits(rate):
    """'100mbit' -> 1e8 (bits/s); raises ValueError on anything else."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", rate.lower())
    if not m:
        raise ValueError("expected a rate like 100mbit or 10gbit, got %r" % rate)
    return float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]


def tbf_args(rate):
    """tc tbf arguments for a rate like 100mbit: the bucket holds 10 ms of traffic (>= 32 KiB)."""
    bits = rate_bits(rate)
    return ["tbf", "rate", rate, "burst", str(max(32768, int(bits / 8 / 100))), "latency", "50ms"]


def check_netns():
    """None if this process can create namespaces and shape links, else the reason it cannot."""
    os.environ["PATH"] = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
    if os.geteuid() != 0:
        return "needs root (creates network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return "'%s' not found (Debian package iproute2)" % tool
    probe = "netnsprobe-%d" % os.getpid()
    p = sh("ip", "netns", "add", probe, check=False)
    if p.returncode != 0:
        return "'ip netns add' is not permitted here: " + p.stdout.strip()
    sh("ip", "netns", "del", probe, check=False)
    return None


class Network:
    """The namespaces, veths and bridge of one owner (names carry its pid and a 2-letter tag).

    hosts: [(name, octet)], name short ([a-z0-9], at most 4 characters: Linux interface names
    are at most 15 bytes).
    """

    def __init__(self, owner_pid, hosts, tag="ps", prefix=None, subnet="10.77.0", log=None):
        self.pid = owner_pid
        self.hosts = list(hosts)
        self.tag = tag
        self.prefix = prefix or "%se2e" % tag
        self.subnet = subnet
        self.bridge = "%sbr%d" % (tag, owner_pid)
        self.log = log or (lambda msg: None)
        self.rate = ""

    def ns(self, host):
        return "%s-%d-%s" % (self.prefix, self.pid, host)

    def veth(self, host):
        return "%sv%d%s" % (self.tag, self.pid, host)

    def addr(self, host):
        return "%s.%d" % (self.subnet, dict(self.hosts)[host])

    def exec_prefix(self, host):
        return ["ip", "netns", "exec", self.ns(host)]

    def create(self, shape=""):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        # Bridged frames must not meet the host's iptables (a FORWARD policy of DROP would eat them).
        sh("ip", "link", "set", self.bridge, "type", "bridge", "nf_call_iptables", "0", check=False)
        sh("ip", "link", "set", self.bridge, "up")
        for host, octet in self.hosts:
            ns, veth = self.ns(host), self.veth(host)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", self.bridge)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "-n", ns, "addr", "add", "%s.%d/24" % (self.subnet, octet), "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.shape(shape)
        self.log("network: bridge %s, hosts %s" % (self.bridge, ", ".join(
            "%s=%s" % (self.ns(h), self.addr(h)) for h, _ in self.hosts)) + (", tbf %s" % shape if shape else ""))

    def shape(self, rate):
        """Shapes every link (both directions) at rate, e.g. '1gbit'; '' removes the shaping."""
        if rate:
            tbf_args(rate)  # validates before anything changes
        for host, _ in self.hosts:
            veth, ns = self.veth(host), self.ns(host)
            if rate:
                sh("tc", "qdisc", "replace", "dev", veth, "root", *tbf_args(rate))
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf_args(rate))
            elif self.rate:
                sh("tc", "qdisc", "del", "dev", veth, "root", check=False)
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        self.rate = rate

    def kill_processes(self):
        """SIGKILLs every process in this network's namespaces."""
        existing = set(sh("ip", "netns", "list", check=False).stdout.split())
        for host, _ in self.hosts:
            if self.ns(host) in existing:
                _kill_in(self.ns(host))

    @staticmethod
    def remove(pid, tag="ps", prefix=None):
        """Removes everything of owner `pid`: processes in its namespaces first, then the links."""
        prefix = prefix or "%se2e" % tag
        mine = re.compile(r"%s-%d-\w+$" % (re.escape(prefix), pid))
        for ns in sh("ip", "netns", "list", check=False).stdout.split():
            if mine.match(ns):
                _kill_in(ns)
                sh("ip", "netns", "del", ns, check=False)
        # Deleting a namespace deletes its eth0 and with it the veth pair; these are leftovers.
        links = sh("ip", "-o", "link", "show", check=False).stdout
        for name in re.findall(r"^\d+: (%sv%d\w+)[@:]" % (tag, pid), links, re.M):
            sh("ip", "link", "del", name, check=False)
        sh("ip", "link", "del", "%sbr%d" % (tag, pid), check=False)

    @staticmethod
    def remove_stale(tag="ps", prefix=None, log=None):
        """Removes what owners that died without cleaning up (SIGKILL) left behind."""
        prefix = prefix or "%se2e" % tag
        pids = set()
        for name in sh("ip", "netns", "list", check=False).stdout.split():
            m = re.fullmatch(r"%s-(\d+)-\w+" % re.escape(prefix), name)
            if m:
                pids.add(int(m.group(1)))
        for pid in pids:
            if pid != os.getpid() and not os.path.exists("/proc/%d" % pid):
                if log:
                    log("removing the namespaces of dead run %d" % pid)
                Network.remove(pid, tag=tag, prefix=prefix)


def _kill_in(ns):
    for p in sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
