"""Processes an integration test launches (ddprun agents, ddpstore, torchrun, each optionally
inside a network namespace) with their output in files, the `cluster` fixture that starts
several and kills them all at teardown, and the bounded waits and record readers around them.

Every process a test registers is killed at teardown together with everything it started
(workers, guardians, zygotes), whatever happened, so no test leaves orphans. Every wait is
bounded: a hang of ddprun fails the test instead of stalling CI.
"""
import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from testenv import TORCH1_PYTHON, clean_env, pid_alive, wait_for

# c10d rendezvous settings of the multi-node tests: small timeouts so failures show quickly,
# generous enough for a loaded 2-core CI machine.
FAST_CONF = ("join_timeout=60,last_call_timeout=1,close_timeout=10,keep_alive_interval=1,"
             "keep_alive_max_attempt=3")


def c10d_flags(endpoint, nnodes, run_id, conf=FAST_CONF, nproc=1, max_restarts=0):
    return [f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}", f"--rdzv_conf={conf}",
            f"--max_restarts={max_restarts}"]


def worker_lookup(test_dir):
    """worker(name) for a test directory: the path (a str) of TEST_DIR/workers/NAME."""
    workers = pathlib.Path(test_dir) / "workers"
    return lambda name: str(workers / name)


def descendants(pid):
    """Every process below pid (found through /proc/<pid>/task/*/children), pid excluded."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                found += children
                todo += children
        except OSError:  # p exited meanwhile
            pass
    return found


def kill_tree(proc):
    """SIGKILL a process (anything with a .pid, e.g. an agent) and everything it started (its
    workers, its guardian) at once: the node is gone and no process of it can say goodbye.
    Returns the pids killed, proc's first."""
    pids = [proc.pid] + descendants(proc.pid)
    for p in pids:
        try:
            os.kill(p, signal.SIGSTOP)  # freeze first, so nothing reacts to the others' deaths
        except ProcessLookupError:
            pass
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


class Proc:
    """One process with its output in files: stdout and stderr together in log_path, or, with
    err_path, stderr apart in that file. With netns it runs under `ip netns exec NETNS` (which
    execs it: the pid is the program's)."""

    def __init__(self, cmd, log_path, env=None, netns=None, err_path=None):
        self.cmd = [str(c) for c in cmd]
        if netns:
            self.cmd = ["ip", "netns", "exec", netns] + self.cmd
        self.log_path = pathlib.Path(log_path)
        self.err_path = pathlib.Path(err_path) if err_path else None
        self._log = open(self.log_path, "w")
        self._err = open(self.err_path, "w") if err_path else None
        self.started = time.monotonic()
        self.elapsed = None  # seconds from start to exit, once wait() saw it
        self.popen = subprocess.Popen(self.cmd, env=env or clean_env(), stdout=self._log,
                                      stderr=self._err or subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        self.pid = self.popen.pid

    def log(self):
        """Everything written so far (only stdout where stderr goes to err_path)."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stdout(self):
        return self.log()

    def stderr(self):
        if self._err is None:
            return self.log()
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def output(self):
        """What to show when an assertion about this process fails."""
        if self._err is None:
            return self.log()
        return f"--- stderr ---\n{self.stderr()}\n--- stdout ---\n{self.stdout()}"

    def wait(self, timeout=120):
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.cmd[:4]}... still running after {timeout} s:\n"
                                 + self.output())
        self.elapsed = time.monotonic() - self.started
        return code

    def running(self):
        return self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.running():
            self.popen.send_signal(sig)

    def close(self):
        """Kills the process and its whole tree (only while it runs: an exited process's pid
        may already belong to another), then closes the output files."""
        if self.running():
            kill_tree(self)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._log.close()
        if self._err:
            self._err.close()


class Cluster:
    """The processes of one test (agents, stores, anything add()ed); close() kills them all."""

    def __init__(self, ddprun, tmp_path):
        self.ddprun = ddprun
        self.tmp = pathlib.Path(tmp_path)
        self.procs = []
        self.count = 0

    def add(self, proc):
        """Registers a process started by the test, so teardown kills it too."""
        self.procs.append(proc)
        return proc

    def agent(self, flags, entry, *args, addr=None, netns=None, env=None, python=TORCH1_PYTHON,
              warm_start=False):
        """ddprun FLAGS --log_dir TMP/logs_I [--warm-start=off] [--local_addr=ADDR] ENTRY ARGS,
        output in TMP/agent_I.log.

        Warm start (on by default for elastic jobs) is off unless asked for: three agents
        on this 2-core machine each importing torch in a zygote, again after every attempt,
        starve the etcd and keep-alive timings these tests are about."""
        i = self.count
        self.count += 1
        cmd = [self.ddprun, *flags, "--log_dir", self.tmp / f"logs_{i}"]
        if not warm_start and not any(str(f).startswith("--warm") for f in flags):
            cmd.append("--warm-start=off")
        if addr:
            cmd.append(f"--local_addr={addr}")
        return self.add(Proc([*cmd, entry, *args], self.tmp / f"agent_{i}.log",
                             env=env or clean_env(python=python), netns=netns))

    def ddpstore(self, ddpstore_bin, *flags, host="127.0.0.1", netns=None):
        """A ddpstore (with flags) on a free port; returns (proc, port) once it listens."""
        p = self.add(Proc([ddpstore_bin, "--host", host, "--port", "0", *flags],
                          self.tmp / f"ddpstore_{len(self.procs)}.log", netns=netns))
        m = wait_for(lambda: re.search(r"listening on \S+:(\d+)", p.log()), timeout=30)
        assert m, p.log()
        return p, int(m.group(1))

    def close(self):
        for p in self.procs:
            p.close()


@pytest.fixture
def cluster(ddprun, tmp_path):
    """A Cluster for the test (tests/conftest.py offers it to every test directory)."""
    with contextlib.closing(Cluster(ddprun, tmp_path)) as c:
        yield c


def closing_all(make):
    """The body of a fixture that hands a test a maker of things it may want several of
    (network hosts, ssh hosts): yields make, and at teardown closes every thing it made.

        @pytest.fixture
        def hosts():
            yield from closing_all(Hosts)
    """
    made = []

    def make_and_keep(*args, **kwargs):
        thing = make(*args, **kwargs)
        made.append(thing)
        return thing

    try:
        yield make_and_keep
    finally:
        for thing in made:
            thing.close()


def records(path):
    """JSON lines (what workers append, or ddprun's --event-log); [] while the file is absent."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(predicate, what, timeout=60, interval=0.02):
    """wait_for that fails the test, saying what it waited for, when the time is up."""
    value = wait_for(predicate, timeout=timeout, interval=interval)
    assert value, f"timed out after {timeout} s waiting for {what}"
    return value


def all_dead(pids, timeout=30):
    """Whether every pid is gone (or a zombie) within timeout seconds."""
    return wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=timeout)
