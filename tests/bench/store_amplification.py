"""The amplification rows of tests/bench/store: a well-behaved client's latency while other
connections ask for large replies and never read them.

Against one running server (2.x dialect, store_helpers' byte-level client), two phases:
  1. baseline: one client does SET+GET round trips of a small key for S seconds;
  2. attack: K attacker connections each SET an 8 MiB value and pipeline 64 GETs of it that
     they never read (tests/store/test_amplification.py's attack; 512 MiB of replies asked
     for per connection), and stay open, reading nothing, while the same client goes on
     for another S seconds on its same connection.
The server's RSS (VmRSS) is read at the end of each phase and polled during the attack: past
--rss-cap-mib the attack is stopped (its connections closed) and reported as such.

Run inside the server's network namespace (torch 2.x's server reverse-resolves its clients):
  ip netns exec NS python3 tests/bench/store_amplification.py --port P --server-pid PID
      [--seconds S] [--attackers K] [--rss-cap-mib M]
Prints one "result key=value ..." line, like store_loadgen.
"""
import argparse
import os
import pathlib
import re
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "store"))
from store_helpers import HELLO, V2, Conn, op, s, u32  # noqa: E402

VALUE = 8 << 20  # the attacker's value
GETS = 64  # pipelined GETs of it per attacker connection
REQUEST_TIMEOUT = 10.0  # a good-client round trip slower than this is an error
SETTLE = 1.0  # the attack phase lasts until this long after the last attacker has sent...
SETTLE_LIMIT = 60.0  # ...but no more than this beyond its nominal length


def rss_mib(pid):
    """The process's VmRSS in MiB, or None once it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def alive(pid):
    """True while pid exists and is not a zombie (the bench is its parent, not us)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class GoodClient:
    """SET+GET round trips of a small key on one connection, reconnecting after a failure."""

    def __init__(self, port, server_pid):
        self.port, self.pid = port, server_pid
        self.conn = None
        self.value = b"v" * 32
        self.request = op(V2, "SET", s("good"), s(self.value)) + op(V2, "GET", s("good"))

    def _connect(self):
        if self.conn is None:
            self.conn = Conn(self.port, torch2=True, timeout=REQUEST_TIMEOUT)

    def _drop(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def run(self, seconds, until=None):
        """Round trips for `seconds`, and then for as long as `until()` says (at most
        SETTLE_LIMIT more): (latencies in s, errors, server_died)."""
        latencies, errors = [], 0
        start = time.monotonic()
        deadline, limit = start + seconds, start + seconds + SETTLE_LIMIT
        while time.monotonic() < deadline or (until and until() and time.monotonic() < limit):
            try:
                self._connect()
                t0 = time.perf_counter()
                self.conn.send(self.request)
                reply = self.conn.recv_bytes()
                latencies.append(time.perf_counter() - t0)
                if reply != self.value:
                    errors += 1
            except (OSError, ConnectionError, AssertionError):
                errors += 1
                self._drop()
                if not alive(self.pid):
                    return latencies, errors, True
                time.sleep(0.05)
        return latencies, errors, not alive(self.pid)


class Attack:
    """K connections asking for 64 x 8 MiB each and never reading; a watcher polls the
    server's RSS and stops the attack (closes them) past the cap."""

    def __init__(self, port, server_pid, attackers, cap_mib):
        self.port, self.pid, self.k, self.cap = port, server_pid, attackers, cap_mib
        self.socks, self.lock = [], threading.Lock()
        self.stopped = threading.Event()  # the cap was hit
        self.sent_at = None  # when every attacker had sent its requests (or gave up)
        self.done = threading.Event()  # the measurement is over
        self.peak = 0.0
        self.failed = 0  # attacker connections that could not send their requests
        self.threads = [threading.Thread(target=self._attack, daemon=True),
                        threading.Thread(target=self._watch, daemon=True)]

    def start(self):
        for t in self.threads:
            t.start()

    def _attack(self):
        try:
            self._attack_all()
        finally:
            self.sent_at = time.monotonic()

    def settling(self):
        """True until every attacker has sent and the server has had SETTLE s to act on it."""
        return self.sent_at is None or time.monotonic() < self.sent_at + SETTLE

    def _attack_all(self):
        value = b"x" * VALUE
        for i in range(self.k):
            if self.stopped.is_set() or self.done.is_set():
                return
            key = f"big{i}"
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                # A small window: the kernel holds little of the replies, the server the rest.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.settimeout(60)
                with self.lock:
                    self.socks.append(sock)
                sock.connect(("127.0.0.1", self.port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(HELLO + op(V2, "PING", u32(0xABCD)))
                got = b""
                while len(got) < 4:
                    chunk = sock.recv(4 - len(got))
                    if not chunk:
                        raise ConnectionError("closed during the handshake")
                    got += chunk
                sock.sendall(op(V2, "SET", s(key), s(value)) +
                             b"".join(op(V2, "GET", s(key)) for _ in range(GETS)))
            except OSError:
                self.failed += 1  # includes a send cut short by stop()

    def _watch(self):
        while not self.done.is_set():
            rss = rss_mib(self.pid)
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            if rss > self.cap:
                self.stopped.set()
                self.close()
                return
            time.sleep(0.02)

    def close(self):
        with self.lock:
            for sock in self.socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self.socks = []

    def finish(self):
        self.done.set()
        self.close()  # wakes an attacker still sending to a server that does not read
        for t in self.threads:
            t.join(30)
        self.close()


def summary(prefix, latencies, seconds):
    ms = sorted(1000 * x for x in latencies)
    rate = {f"{prefix}_per_sec": f"{len(ms) / seconds:.1f}"}
    if not ms:
        return {**rate, f"{prefix}_n": 0, f"{prefix}_p50_ms": "nan", f"{prefix}_p99_ms": "nan",
                f"{prefix}_max_ms": "nan"}
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return {**rate, f"{prefix}_n": len(ms), f"{prefix}_p50_ms": f"{statistics.median(ms):.4f}",
            f"{prefix}_p99_ms": f"{p99:.4f}", f"{prefix}_max_ms": f"{ms[-1]:.4f}"}


def run(port, server_pid, seconds, attackers, cap_mib):
    good = GoodClient(port, server_pid)
    good.run(min(0.2, seconds / 10))  # connect and warm up; not counted
    res = {"seconds": seconds, "attackers": attackers}

    start = time.monotonic()
    lat, err, died = good.run(seconds)
    res.update(summary("base", lat, time.monotonic() - start), base_errors=err,
               base_died=int(died))
    rss = rss_mib(server_pid)
    res["base_rss_mib"] = f"{rss:.1f}" if rss is not None else "nan"
    if died:
        res.update(summary("attack", [], 1), attack_seconds=0, attack_errors=0, attack_died=1,
                   attack_rss_mib="nan", attack_peak_mib="nan", attack_stopped=0,
                   attack_failed=0)
        return res

    attack = Attack(port, server_pid, attackers, cap_mib)
    attack.start()
    start = time.monotonic()
    try:
        # The phase covers the attack as it is sent and then S s (at least) of it held open.
        lat, err, died = good.run(seconds, until=attack.settling)
        res["attack_seconds"] = f"{time.monotonic() - start:.3f}"
        rss = rss_mib(server_pid)  # with the attackers still open, before they are closed
    finally:
        attack.finish()
    res.update(summary("attack", lat, float(res["attack_seconds"])), attack_errors=err,
               attack_died=int(died),
               attack_rss_mib=f"{rss:.1f}" if rss is not None else "nan",
               attack_peak_mib=f"{attack.peak:.1f}", attack_stopped=int(attack.stopped.is_set()),
               attack_failed=attack.failed)
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--server-pid", type=int, required=True)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--attackers", type=int, default=4)
    p.add_argument("--rss-cap-mib", type=float, default=4096)
    a = p.parse_args()
    res = run(a.port, a.server_pid, a.seconds, a.attackers, a.rss_cap_mib)
    print("result " + " ".join(f"{k}={v}" for k, v in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
