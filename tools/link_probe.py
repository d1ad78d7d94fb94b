"""A TCP probe of the link between two hosts: round trip, rate, and the time of a worker step's
exchange (push bytes out, pull bytes back). Used by the advisor and the crossover study.
"""
import json
import subprocess
import sys


PROBE_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def drain(n):
    while n > 0: n -= len(c.recv(min(n, 1 << 20)))
while True:
    m = c.recv(1)
    if not m or m == b"q": break
    if m == b"p": c.sendall(b"p"); continue
    if m == b"x":  # an exchange: take n bytes, answer with k bytes
        h = c.recv(16, socket.MSG_WAITALL)
        drain(int.from_bytes(h[:8], "little")); c.sendall(bytes(int.from_bytes(h[8:], "little"))); continue
    drain(int.from_bytes(c.recv(8, socket.MSG_WAITALL), "little"))
    c.sendall(b"d")
"""

PROBE_CLIENT = r"""
import socket, sys, time, json
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(50):
    t = time.perf_counter(); c.sendall(b"p"); c.recv(1); rtts.append(time.perf_counter() - t)
rtts.sort()
n = int(sys.argv[3]); buf = b"x" * (1 << 20); t = time.perf_counter()
def send(n):
    while n > 0: k = min(n, len(buf)); c.sendall(buf[:k]); n -= k
c.sendall(b"s" + n.to_bytes(8, "little")); send(n)
c.recv(1); dt = time.perf_counter() - t
# Exchanges "PUSHxPULL": send PUSH bytes, receive PULL bytes, back to back like a worker's
# steps; the median of the repetitions after one warm-up.
exchanges = {}
for spec in filter(None, sys.argv[4].split(",")):
    push, pull = (int(v) for v in spec.split("x"))
    times = []
    for i in range(int(sys.argv[5]) + 1):
        t = time.perf_counter(); c.sendall(b"x" + push.to_bytes(8, "little") + pull.to_bytes(8, "little")); send(push)
        left = pull
        while left > 0: left -= len(c.recv(min(left, 1 << 20)))
        times.append(time.perf_counter() - t)
    times = sorted(times[1:])
    exchanges[spec] = times[len(times) // 2]
c.sendall(b"q")
print(json.dumps({"rtt_s": rtts[len(rtts) // 2], "bandwidth_Bps": n / dt, "probe_bytes": n, "exchange_s": exchanges}))
"""


def exchange_key(push_bytes, pull_bytes):
    return "%dx%d" % (int(push_bytes), int(pull_bytes))


def probe_link(exec_server, exec_client, addr, port=7999, nbytes=32 << 20, exchanges=(), repeat=5):
    """TCP ping-pong (median of 50), one stream of nbytes from client host to server host, and
    the median time of `repeat` back-to-back exchanges per (push bytes, pull bytes) pair: the
    client sends push bytes, the server answers with pull bytes, as a worker's step does.

    exec_server / exec_client: argv prefixes that run a command on each host ([] = here).
    Returns dict(rtt_s, bandwidth_Bps, probe_bytes, exchange_s={"PUSHxPULL": seconds}).
    """
    specs = ",".join(exchange_key(a, b) for a, b in exchanges)
    srv = subprocess.Popen(exec_server + [sys.executable, "-c", PROBE_SERVER, "0.0.0.0", str(port)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = srv.stdout.readline().split()
        if len(ready) != 2 or ready[0] != "ready":
            raise RuntimeError("link probe: the receiver did not start: %s" % " ".join(ready))
        port = int(ready[1])  # the one asked for, or the one the kernel picked for port 0
        p = subprocess.run(exec_client + [sys.executable, "-c", PROBE_CLIENT, addr, str(port), str(nbytes), specs,
                                          str(repeat)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("link probe failed: " + p.stdout[-500:])
        return json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait()
        srv.stdout.close()
