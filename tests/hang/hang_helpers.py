"""Helpers for ddprun's hang, health and event-log tests: jobs started in the background with
their output in files (killed at teardown whatever happened), the event log, the stacks files,
and plain HTTP requests to the health endpoints.

Every wait is bounded: a hang of ddprun fails the test instead of stalling CI.
"""
import http.client
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "launcher"))
from launcher_helpers import SOURCE_DIR, clean_env, free_port, pid_alive, wait_for  # noqa: E402,F401
from conftest import TORCH1_PYTHON, TORCH2_PYTHON  # noqa: E402,F401

WORKERS = pathlib.Path(__file__).parent / "workers"
# Two-node tests, as tests/multinode/mn_helpers.py: small timeouts so failures show quickly,
# generous enough for a loaded 2-core CI machine.
FAST_CONF = ("join_timeout=60,last_call_timeout=1,close_timeout=10,keep_alive_interval=1,"
             "keep_alive_max_attempt=3")


def worker(name):
    return str(WORKERS / name)


def torch2_path_env(**extra):
    """clean_env for torch 2.x workers, with the venv's bin (py-spy) first on PATH."""
    env = clean_env(python=TORCH2_PYTHON, **extra)
    env["PATH"] = os.path.dirname(TORCH2_PYTHON) + os.pathsep + env.get("PATH", "")
    return env


class Job:
    """One ddprun in the background; stdout and stderr each in a file."""

    def __init__(self, cmd, out_dir, name="ddprun", env=None):
        self.cmd = [str(c) for c in cmd]
        out_dir = pathlib.Path(out_dir)
        self.out_path = out_dir / f"{name}.stdout"
        self.err_path = out_dir / f"{name}.stderr"
        self._out = open(self.out_path, "w")
        self._err = open(self.err_path, "w")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(self.cmd, env=env or clean_env(), stdout=self._out,
                                      stderr=self._err, stdin=subprocess.DEVNULL)
        self.pid = self.popen.pid
        self.elapsed = None

    def stderr(self):
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def stdout(self):
        self._out.flush()
        return self.out_path.read_text(errors="replace")

    def output(self):
        return f"--- stderr ---\n{self.stderr()}\n--- stdout ---\n{self.stdout()}"

    def wait(self, timeout=120):
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ddprun still running after {timeout} s:\n{self.output()}")
        self.elapsed = time.monotonic() - self.started
        return code

    def running(self):
        return self.popen.poll() is None

    def close(self):
        if self.running():
            self.popen.send_signal(signal.SIGKILL)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._out.close()
        self._err.close()


class Jobs:
    def __init__(self, ddprun, tmp_path):
        self.ddprun = ddprun
        self.tmp = pathlib.Path(tmp_path)
        self.started = []

    def start(self, flags, entry, *args, env=None, name=None, python=TORCH1_PYTHON):
        """ddprun FLAGS --log-dir TMP/logs_NAME ENTRY ARGS (a Python script, through
        PYTHON_EXEC=python unless env says otherwise)."""
        name = name or f"ddprun{len(self.started)}"
        log_dir = self.tmp / f"logs_{name}"
        job = Job([self.ddprun, *flags, "--log-dir", log_dir, entry, *args], self.tmp, name,
                  env=env or clean_env(python=python))
        job.log_dir = log_dir
        self.started.append(job)
        return job

    def close(self):
        for job in self.started:
            job.close()


@pytest.fixture
def jobs(ddprun, tmp_path):
    j = Jobs(ddprun, tmp_path)
    yield j
    j.close()


def records(path):
    """JSON lines (the workers' records, or ddprun's --event-log)."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(path, kind=None):
    recs = records(path)
    return [r for r in recs if kind is None or r.get("event") == kind]


def stacks_file(log_dir, attempt, local_rank):
    """The stacks file of a worker: <log_dir>/<run_id>_<random>/attempt_N/L/stacks.txt."""
    found = sorted(pathlib.Path(log_dir).glob(f"*/attempt_{attempt}/{local_rank}/stacks.txt"))
    assert len(found) <= 1, found
    return found[0] if found else None


def wait_until(predicate, what, timeout=60, interval=0.02):
    value = wait_for(predicate, timeout=timeout, interval=interval)
    assert value, f"timed out after {timeout} s waiting for {what}"
    return value


def all_dead(pids, timeout=10):
    return wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=timeout)


def health_port(job, timeout=30):
    """The port from `health endpoints: http://127.0.0.1:PORT/healthz, /metrics, /status`."""
    pattern = r"health endpoints: http://127\.0\.0\.1:(\d+)/healthz, /metrics, /status"
    m = wait_for(lambda: re.search(pattern, job.stderr()), timeout=timeout)
    assert m, f"no health endpoints line:\n{job.output()}"
    return int(m.group(1))


def http_request(port, path, method="GET", timeout=5, host="127.0.0.1", body=None):
    """(status, body text) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace"), dict(r.getheaders())
    finally:
        conn.close()


def http_get(port, path, timeout=5):
    status, body, _ = http_request(port, path, timeout=timeout)
    return status, body


def try_get(port, path, timeout=5):
    """(status, body) or None when the connection failed (refused, closed, timed out)."""
    try:
        return http_get(port, path, timeout=timeout)
    except (OSError, http.client.HTTPException):
        return None


def job_summary(text):
    m = re.search(r"job summary: (\d+) attempts?, (\d+) restarts?, (\d+) re-formations?, "
                  r"(\d+) hangs?, wall time ([\d.]+) s", text)
    assert m, f"no job summary line in:\n{text}"
    return {"attempts": int(m.group(1)), "restarts": int(m.group(2)),
            "reformations": int(m.group(3)), "hangs": int(m.group(4)),
            "wall_s": float(m.group(5))}


def listening(port, host="127.0.0.1"):
    """Whether something accepts connections on host:port (an agent hosting the store)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
