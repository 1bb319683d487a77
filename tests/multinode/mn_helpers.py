"""Helpers for multi-node tests: several ddprun agents on this machine, each a separate node
(its own --local_addr on loopback, or its own network namespace), a ddpstore endpoint, and
reading what the workers recorded.

Every process a test starts is registered with a Cluster and killed at teardown, whatever
happened. Waits are bounded: a hang fails the test instead of stalling CI.
"""
import json
import os
import pathlib
import re
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "launcher"))
from launcher_helpers import (DDPRUN_ONLY_ENV, SOURCE_DIR, clean_env, free_port,  # noqa: E402,F401
                              pid_alive, wait_for)

WORKERS = pathlib.Path(__file__).parent / "workers"
EXAMPLES = SOURCE_DIR / "examples" / "python"
TORCH1_PYTHON = os.environ.get("DDPRUN_TORCH1_PYTHON", "/usr/bin/python3")

# Small timeouts so failures show quickly; generous enough for a loaded 2-core CI machine.
FAST_CONF = "join_timeout=60,last_call_timeout=1,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3"


def worker(name):
    return str(WORKERS / name)


class Proc:
    """One process with its combined output in a file."""

    def __init__(self, cmd, log_path, env=None, netns=None):
        self.cmd = [str(c) for c in cmd]
        if netns:
            self.cmd = ["ip", "netns", "exec", netns] + self.cmd
        self.log_path = pathlib.Path(log_path)
        self._log = open(self.log_path, "w")
        self.popen = subprocess.Popen(self.cmd, env=env or clean_env(), stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.popen.pid

    def wait(self, timeout=120):
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.cmd[:4]}... still running after {timeout} s:\n"
                                 + self.log())

    def log(self):
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def running(self):
        return self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.running():
            self.popen.send_signal(sig)

    def close(self):
        self.kill(signal.SIGKILL)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


class Cluster:
    """Agents and stores of one test; everything is killed at teardown."""

    def __init__(self, ddprun, tmp_path, netns=None):
        self.ddprun = ddprun
        self.tmp = pathlib.Path(tmp_path)
        self.procs = []
        self.count = 0

    def agent(self, flags, entry, *args, addr=None, netns=None, env=None, python=TORCH1_PYTHON,
              warm_start=False):
        """Warm start (on by default for elastic jobs) is off unless asked for: three agents
        on this 2-core machine each importing torch in a zygote, again after every attempt,
        starve the etcd and keep-alive timings these tests are about."""
        i = self.count
        self.count += 1
        cmd = [self.ddprun, *flags, "--log_dir", self.tmp / f"logs_{i}"]
        if not warm_start and not any(str(f).startswith("--warm") for f in flags):
            cmd.append("--warm-start=off")
        if addr:
            cmd.append(f"--local_addr={addr}")
        p = Proc([*cmd, entry, *args], self.tmp / f"agent_{i}.log",
                 env=env or clean_env(python=python), netns=netns)
        self.procs.append(p)
        return p

    def ddpstore(self, ddpstore_bin, host="127.0.0.1", netns=None):
        p = Proc([ddpstore_bin, "--host", host, "--port", "0"],
                 self.tmp / f"ddpstore_{len(self.procs)}.log", netns=netns)
        self.procs.append(p)
        m = wait_for(lambda: re.search(r"listening on \S+:(\d+)", p.log()), timeout=30)
        assert m, p.log()
        return p, int(m.group(1))

    def close(self):
        for p in self.procs:
            p.close()


def records(path):
    """JSON lines appended by workers/record.py."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def c10d_flags(endpoint, nnodes, run_id, conf=FAST_CONF, nproc=1, max_restarts=0):
    return [f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}", f"--rdzv_conf={conf}",
            f"--max_restarts={max_restarts}"]


def worker_pids_of(agent_log):
    """Worker pids an agent reported (failure lines) are not enough: read them from records."""
    return [int(p) for p in re.findall(r"pid (\d+)", agent_log)]


def wait_until(predicate, what, timeout=60):
    value = wait_for(predicate, timeout=timeout, interval=0.02)
    assert value, f"timed out after {timeout} s waiting for {what}"
    return value


def all_dead(pids, timeout=30):
    return wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=timeout)


def store_has(port, key, host="127.0.0.1"):
    """Whether the store at host:port holds `key` (a raw 2.x-dialect VALIDATE, PING, CHECK;
    the key is sent as given, the way ddprun's agents write theirs: /ddprun/<job>/...)."""
    key = key.encode()
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 7))
        s.recv(4)
        s.sendall(b"\x05" + struct.pack("<Q", 1) + struct.pack("<Q", len(key)) + key)
        return s.recv(1) == b"\x00"
