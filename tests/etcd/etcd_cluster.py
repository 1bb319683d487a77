"""A real etcd cluster for tests and benchmarks: N members of Debian's /usr/bin/etcd on free
ports under a temp dir, optionally with TLS (make_certs), members that can be stopped, frozen
and restarted, and a look at the keys through etcd's HTTP gateway (no etcdctl needed).

    from etcd_cluster import EtcdCluster, make_certs  # (make_certs: etcd_access.py)
    with EtcdCluster(tmp_path, members=3) as etcd:    # or etcd.start() ... etcd.close()
        ddprun ... --rdzv-backend=etcd --rdzv-endpoint=etcd.endpoint_arg() ...
        etcd.stop_member(etcd.leader_index())
        etcd.keys("/ddprun/job/")

Every member runs in its own process group with PR_SET_PDEATHSIG, and close() (also run at
interpreter exit) kills them all, so nothing outlives a failing test or a killed pytest.
Every wait is bounded and raises EtcdError with the member's log tail.
"""
import atexit
import base64
import ctypes
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
import uuid

from etcd_access import _b64, _prefix_end, _request, make_certs  # noqa: F401 (re-exported)

ETCD = os.environ.get("DDPRUN_ETCD", "/usr/bin/etcd")
# Fast elections, so that losing the leader costs well under a second.
HEARTBEAT_MS = 50
ELECTION_MS = 500
START_TIMEOUT = 30.0

# Ports are drawn below Linux's ephemeral range (32768-60999), so an outgoing connection of
# another test cannot take a member's port while the member is stopped and about to rejoin.
_PORT_RANGE = (20000, 32000)
_LIVE = set()  # clusters not closed yet, closed at exit


class EtcdError(AssertionError):
    pass


def etcd_available():
    """None when etcd can run here, else why not (for pytest.skip)."""
    if not os.access(ETCD, os.X_OK):
        return f"{ETCD} not found (apt-get install etcd-server)"
    return None


def _pdeathsig():
    # Runs in the child between fork and exec: its own session, killed if the test dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Member:
    def __init__(self, index, host, netns, data_dir, log_path):
        self.index = index
        self.name = f"m{index}"
        self.host = host
        self.netns = netns
        self.data_dir = data_dir
        self.log_path = log_path
        self.client_port = self.peer_port = None
        self.popen = None
        self.frozen = False

    def running(self):
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, n=15):
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-n:])


class EtcdCluster:
    """See the module docstring. Member i listens on hosts[i] (default: host for all), inside
    network namespace netns[i] when given (the caller creates the namespace; the health checks
    then run inside it with `ip netns exec`)."""

    def __init__(self, tmp_dir, members=1, tls=None, enable_v2=False, host="127.0.0.1",
                 hosts=None, netns=None):
        self.tmp = pathlib.Path(tmp_dir) / f"etcd_{uuid.uuid4().hex[:8]}"
        self.tls = tls
        self.enable_v2 = enable_v2
        hosts = list(hosts) if hosts else [host] * members
        netns = list(netns) if netns else [None] * members
        if len(hosts) != members or len(netns) != members:
            raise ValueError("hosts and netns need one entry per member")
        self.token = f"ddprun-test-{uuid.uuid4().hex}"
        self.members = [Member(i, hosts[i], netns[i], self.tmp / f"m{i}.data",
                               self.tmp / f"m{i}.log") for i in range(members)]
        self.scheme = "https" if tls else "http"
        self._started = False

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout=START_TIMEOUT):
        """Starts every member as a new cluster and waits until all answer healthy. Ports are
        drawn at random; a member that cannot bind makes the whole cluster start again on
        other ports (a new cluster's peer URLs are fixed at its start)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        _LIVE.add(self)
        deadline = time.monotonic() + timeout
        for attempt in range(8):
            self._pick_ports()
            for m in self.members:
                subprocess.run(["rm", "-rf", str(m.data_dir)], check=False)
                self._spawn(m, "new")
            if self._wait_healthy(deadline, retry_on_bind_clash=True):
                self._started = True
                return self
            self._kill_all()
            self.token = f"ddprun-test-{uuid.uuid4().hex}"
        raise EtcdError("etcd kept losing its ports to other processes")

    def __enter__(self):
        return self if self._started else self.start()

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Kills every member (SIGKILL, whole process group). Idempotent."""
        self._kill_all()
        _LIVE.discard(self)

    def stop_member(self, i, sig=signal.SIGTERM, timeout=15.0):
        """Stops member i. SIGSTOP freezes it (its sockets stay open, nothing answers: a
        member whose host hangs); start_member thaws it. Any other signal waits for it to
        exit (SIGKILL after `timeout`)."""
        m = self.members[i]
        if not m.running():
            return
        if sig == signal.SIGSTOP:
            os.killpg(m.popen.pid, signal.SIGSTOP)
            m.frozen = True
            return
        if m.frozen:
            os.killpg(m.popen.pid, signal.SIGCONT)
            m.frozen = False
        os.killpg(m.popen.pid, sig)
        try:
            m.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(m.popen.pid, signal.SIGKILL)
            m.popen.wait(timeout=10)

    def start_member(self, i, wait=True, timeout=START_TIMEOUT):
        """Brings member i back: thaws a frozen one, or restarts a stopped one on its data dir
        and ports (--initial-cluster-state existing). With wait, returns once its client port
        accepts connections (it answers healthy only once a quorum runs: see wait_healthy)."""
        m = self.members[i]
        if m.frozen:
            os.killpg(m.popen.pid, signal.SIGCONT)
            m.frozen = False
            return
        if m.running():
            return
        self._spawn(m, "existing")
        if wait:
            self._wait_listening(m, time.monotonic() + timeout)

    def stop_all(self, sig=signal.SIGTERM):
        for i in range(len(self.members)):
            self.stop_member(i, sig)

    def start_all(self, timeout=START_TIMEOUT):
        for i in range(len(self.members)):
            self.start_member(i, wait=False)
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout=START_TIMEOUT):
        """Waits until every running member answers /health with true (it has a leader)."""
        self._wait_healthy(time.monotonic() + timeout, retry_on_bind_clash=False)

    # -- what tests look at --------------------------------------------------------------------

    @property
    def endpoints(self):
        """Client endpoints as host:port (no scheme), member order."""
        return [f"{m.host}:{m.client_port}" for m in self.members]

    def endpoint_arg(self, order=None):
        """For --rdzv-endpoint: the endpoints comma-joined (in `order` of member indices)."""
        eps = self.endpoints
        return ",".join(eps[i] for i in (order if order is not None else range(len(eps))))

    def client_url(self, i):
        return f"{self.scheme}://{self.endpoints[i]}"

    def running_members(self):
        return [m.index for m in self.members if m.running() and not m.frozen]

    def status(self, i):
        """Member i's /v3/maintenance/status (member_id, leader, raft term, ...)."""
        return self.call(i, "/v3/maintenance/status", {})

    def leader_index(self, timeout=10.0):
        """Index of the current leader, asking the running members (bounded wait for one)."""
        deadline = time.monotonic() + timeout
        while True:
            ids, leader = {}, None
            for i in self.running_members():
                try:
                    st = self.status(i)
                except Exception:
                    continue
                ids[st["header"]["member_id"]] = i
                leader = st.get("leader") or leader
            if leader in ids:
                return ids[leader]
            if time.monotonic() > deadline:
                raise EtcdError(f"no leader among members {self.running_members()}: "
                                f"{self._tails()}")
            time.sleep(0.05)

    def keys(self, prefix=""):
        """{key: value} of every key under `prefix` ("" = all keys; values decoded as UTF-8,
        'replace')."""
        rng = ({"key": _b64(prefix), "range_end": _prefix_end(prefix)} if prefix
               else {"key": _b64("\0"), "range_end": _b64("\0")})
        out = self.call_any("/v3/kv/range", rng)
        return {base64.b64decode(kv["key"]).decode(errors="replace"):
                base64.b64decode(kv.get("value", "")).decode(errors="replace")
                for kv in out.get("kvs", [])}

    def put(self, key, value):
        self.call_any("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    def lease_count(self):
        return len(self.call_any("/v3/lease/leases", {}).get("leases", []))

    def call(self, i, path, body=None, timeout=2.0):
        """One HTTP gateway request to member i (inside its netns when it has one)."""
        m = self.members[i]
        url = self.client_url(i) + path
        tls = self._client_tls()
        if not m.netns:
            return _request(url, body, *tls, timeout=timeout)
        cmd = ["ip", "netns", "exec", m.netns, sys.executable, __file__, "request", url,
               json.dumps(body), *[t or "" for t in tls]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 10)
        if r.returncode != 0:
            raise EtcdError(f"request to {url} in {m.netns} failed: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def call_any(self, path, body=None):
        errors = []
        for i in self.running_members():
            try:
                return self.call(i, path, body)
            except Exception as e:  # try the next member
                errors.append(f"m{i}: {e}")
        raise EtcdError(f"no etcd member answered {path}: {errors}")

    # -- internals ----------------------------------------------------------------------------

    def _client_tls(self):
        if not self.tls:
            return (None, None, None)
        return (self.tls.ca, self.tls.client_cert, self.tls.client_key)

    def _pick_ports(self):
        taken = set()
        for m in self.members:
            m.client_port, m.peer_port = (self._free_port(m, taken) for _ in range(2))

    def _free_port(self, m, taken):
        for _ in range(200):
            port = random.randint(*_PORT_RANGE)
            if port in taken:
                continue
            if not m.netns:  # a namespace of our own has nothing else listening in it
                try:
                    with socket.socket() as s:
                        s.bind((m.host, port))
                except OSError:
                    continue
            taken.add(port)
            return port
        raise EtcdError(f"no free port on {m.host}")

    def _spawn(self, m, state):
        peer = lambda x: f"http://{x.host}:{x.peer_port}"
        client = f"{self.scheme}://{m.host}:{m.client_port}"
        cmd = [ETCD, "--name", m.name, "--data-dir", str(m.data_dir),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer(m), "--initial-advertise-peer-urls", peer(m),
               "--initial-cluster", ",".join(f"{x.name}={peer(x)}" for x in self.members),
               "--initial-cluster-state", state, "--initial-cluster-token", self.token,
               "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
               "--logger", "zap", "--log-outputs", "stderr",
               f"--enable-v2={'true' if self.enable_v2 else 'false'}"]
        if self.tls:
            cmd += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key,
                    "--trusted-ca-file", self.tls.ca, "--client-cert-auth"]
        if m.netns:
            cmd = ["ip", "netns", "exec", m.netns] + cmd
        with open(m.log_path, "a") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} {state}: {' '.join(cmd)}\n")
            log.flush()
            m.popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       preexec_fn=_pdeathsig)
        m.frozen = False

    def _bind_clash(self, m):
        return (not m.running()) and "address already in use" in m.log_tail(40)

    def _wait_listening(self, m, deadline):
        while time.monotonic() < deadline:
            if not m.running():
                raise EtcdError(f"etcd member {m.name} exited: {m.log_tail()}")
            try:
                if m.netns:
                    self.call(m.index, "/version")
                else:
                    socket.create_connection((m.host, m.client_port), timeout=1).close()
                return
            except Exception:
                time.sleep(0.05)
        raise EtcdError(f"etcd member {m.name} did not listen in time: {m.log_tail()}")

    def _wait_healthy(self, deadline, retry_on_bind_clash):
        pending = set(self.running_members())
        if retry_on_bind_clash:
            pending = {m.index for m in self.members}
        while pending:
            for i in sorted(pending):
                m = self.members[i]
                if not m.running():
                    if retry_on_bind_clash and self._bind_clash(m):
                        return False
                    raise EtcdError(f"etcd member {m.name} exited: {m.log_tail()}")
                try:
                    if self.call(i, "/health", timeout=1.0).get("health") == "true":
                        pending.discard(i)
                except Exception:
                    pass
            if pending and time.monotonic() > deadline:
                raise EtcdError(f"etcd members {sorted(pending)} not healthy in time:\n"
                                + self._tails())
            if pending:
                time.sleep(0.05)
        return True

    def _tails(self):
        return "\n".join(f"--- {m.name} ---\n{m.log_tail()}" for m in self.members)

    def _kill_all(self):
        for m in self.members:
            if m.popen is None:
                continue
            if m.popen.poll() is None:
                try:
                    os.killpg(m.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                m.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@atexit.register
def _close_all():
    for c in list(_LIVE):
        c.close()


if __name__ == "__main__" and len(sys.argv) >= 4 and sys.argv[1] == "request":
    # EtcdCluster.call for a member inside a network namespace: one request, JSON on stdout.
    _tls = ([a or None for a in sys.argv[4:7]] + [None] * 3)[:3]
    print(json.dumps(_request(sys.argv[2], json.loads(sys.argv[3]), *_tls)))
