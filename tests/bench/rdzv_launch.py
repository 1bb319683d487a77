"""How tests/bench/rdzv starts and kills its nodes: the launchers, the rendezvous backends, the
etcd server they share, the network namespace the whole benchmark runs in.

Launchers (`who`):
  ddprun     build/bin/ddprun (DDPRUN_BENCH_BIN_DIR)
  torchrun   Debian's torchrun 1.13 (/usr/bin/python3), c10d only here
  torchrun2  the newest torch 2.x's torchrun, from the venv scripts/setup keeps
             (DDPRUN_TORCH2_VENV), with python-etcd for its etcd-v2 backend
A Backend says which --rdzv_backend and --rdzv_endpoint a launch gets: c10d at a fresh port
(the first agent to bind it hosts the store), or the one etcd server (ddprun: `etcd`, its v3
API; torchrun 2.x: `etcd-v2`, python-etcd over etcd's v2 API, hence --enable-v2).
"""
import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("DDPRUN_BENCH_BIN_DIR", ROOT / "build" / "bin"))
VENV = pathlib.Path(os.environ.get("DDPRUN_TORCH2_VENV",
                                   pathlib.Path.home() / ".cache/ddprun/torch2-venv"))
PYTHON = {"ddprun": "/usr/bin/python3", "torchrun": "/usr/bin/python3",
          "torchrun2": str(VENV / "bin" / "python")}
LABEL = {"ddprun": "ddprun", "torchrun": "torchrun 1.13", "torchrun2": "torchrun 2.x"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def addr(i):
    return f"127.0.{i // 250}.{i % 250 + 2}"


class Backend:
    """Where a job's nodes meet: `kind` is "c10d" (every job gets a port of its own, hosted by
    the first agent that binds it) or "etcd" (every job on the one server, told apart by
    --rdzv_id)."""

    def __init__(self, kind, endpoint=None):
        self.kind, self.endpoint = kind, endpoint

    def job_endpoint(self):
        return self.endpoint or f"127.0.0.1:{free_port()}"

    def flag(self, who):
        if self.kind == "c10d":
            return "c10d"
        return "etcd" if who == "ddprun" else "etcd-v2"

    def label(self, who):
        return f"{LABEL[who]} {self.flag(who)}"


def env(who, worker_python=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_"))}
    e["PYTHON_EXEC"] = worker_python or PYTHON[who]
    e["OMP_NUM_THREADS"] = "1"
    return e


def launch_line(who, backend, endpoint, nnodes, run_id, conf, log_dir, i, max_restarts=0,
                extra=()):
    """One node's command line. Both launchers get --redirects 1 --tee 1 --log_dir, the
    workaround torchrun 1.13 needs on Python 3.11, so that all do the same work."""
    common = [f"--nnodes={nnodes}", "--nproc_per_node=1", f"--rdzv_backend={backend.flag(who)}",
              f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
              f"--rdzv_conf={conf}", f"--max_restarts={max_restarts}", "--redirects", "1",
              "--tee", "1", "--log_dir", str(log_dir)]
    if who == "ddprun":
        return [str(BIN / "ddprun"), *common, f"--local_addr={addr(i)}", *extra]
    return [PYTHON[who], "-m", "torch.distributed.run", "--monitor_interval", "0.1", *common,
            *extra]


def has_etcd_backend():
    """Whether this ddprun takes --rdzv-backend=etcd (it refused it before the etcd backend)."""
    cmd = [str(BIN / "ddprun"), "--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:9",
           "--rdzv_id=probe", "--rdzv_conf=join_timeout=1", "--no_python", "/bin/true"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return True
    return "backend is not supported" not in r.stderr


def torchrun2_etcd_missing():
    """None when the venv's torchrun 2.x can use etcd-v2, else why not."""
    if not os.access(PYTHON["torchrun2"], os.X_OK):
        return f"no torch 2.x venv at {VENV} (scripts/setup)"
    r = subprocess.run([PYTHON["torchrun2"], "-c", "import etcd"], capture_output=True)
    return None if r.returncode == 0 else "python-etcd is not in the venv (scripts/setup)"


@contextlib.contextmanager
def etcd_server():
    """One etcd member (tests/etcd/etcd_cluster.py) with the v2 API on, its data on disk in a
    throwaway dir; yields the etcd Backend."""
    sys.path.insert(0, str(ROOT / "tests" / "etcd"))
    from etcd_cluster import EtcdCluster

    with tempfile.TemporaryDirectory(prefix="ddprun-bench-etcd-") as d:
        cluster = EtcdCluster(d, members=1, enable_v2=True)
        cluster.start()
        try:
            yield Backend("etcd", cluster.endpoint_arg())
        finally:
            cluster.close()


def descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_tree(pid):
    """A node dies: its agent and every process under it, at once. All are stopped before any
    is killed, so none can act on another's death (ddprun's guardian would revoke the agent's
    etcd lease, which a dead host cannot do)."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in descendants(pid):
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass


def read_events(path):
    """The JSON lines of a ddprun --event-log file written so far (a torn last line skipped)."""
    out = []
    try:
        text = pathlib.Path(path).read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def in_netns(argv):
    """Runs the benchmark again inside a network namespace of its own that has only loopback,
    and returns its exit code; None when that is not possible here (not root, no `ip`) or when
    already inside one. torch resolves this host's name, and a resolver that stalls (this
    sandbox's does, 5 s at a time) would be timed as rendezvous; in a namespace without a
    route the lookup fails at once, for every launcher alike."""
    if os.environ.get("DDPRUN_BENCH_NETNS") or os.geteuid() != 0 or not shutil.which("ip"):
        return None
    name = f"ddprun-bench-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        e = dict(os.environ, DDPRUN_BENCH_NETNS=name)
        return subprocess.run(["ip", "netns", "exec", name, sys.executable, *argv],
                              env=e).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
