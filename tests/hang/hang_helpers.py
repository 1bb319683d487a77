"""Helpers for ddprun's hang, health and event-log tests: jobs started in the background with
their output in files (killed at teardown whatever happened), the event log, the stacks files,
and plain HTTP requests to the health endpoints.

Every wait is bounded: a hang of ddprun fails the test instead of stalling CI.
"""
import contextlib
import http.client
import os
import pathlib
import re
import socket

import pytest

from testenv import (SOURCE_DIR, TORCH1_PYTHON, TORCH2_PYTHON, clean_env,  # noqa: F401
                     free_port, pid_alive, wait_for)
from jobs import (FAST_CONF, Cluster, Proc, all_dead, records, wait_until,  # noqa: F401
                  worker_lookup)

worker = worker_lookup(pathlib.Path(__file__).parent)


def torch2_path_env(**extra):
    """clean_env for torch 2.x workers, with the venv's bin (py-spy) first on PATH."""
    env = clean_env(python=TORCH2_PYTHON, **extra)
    env["PATH"] = os.path.dirname(TORCH2_PYTHON) + os.pathsep + env.get("PATH", "")
    return env


class Jobs(Cluster):
    """The ddprun jobs of one test, started with start(); close() kills them all."""

    def start(self, flags, entry, *args, env=None, name=None, python=TORCH1_PYTHON):
        """ddprun FLAGS --log-dir TMP/logs_NAME ENTRY ARGS (a Python script, through
        PYTHON_EXEC=python unless env says otherwise); stdout and stderr in TMP/NAME.stdout
        and TMP/NAME.stderr."""
        name = name or f"ddprun{len(self.procs)}"
        log_dir = self.tmp / f"logs_{name}"
        job = self.add(Proc([self.ddprun, *flags, "--log-dir", log_dir, entry, *args],
                            self.tmp / f"{name}.stdout", err_path=self.tmp / f"{name}.stderr",
                            env=env or clean_env(python=python)))
        job.log_dir = log_dir
        return job


@pytest.fixture
def jobs(ddprun, tmp_path):
    with contextlib.closing(Jobs(ddprun, tmp_path)) as j:
        yield j


def events(path, kind=None):
    recs = records(path)
    return [r for r in recs if kind is None or r.get("event") == kind]


def stacks_file(log_dir, attempt, local_rank):
    """The stacks file of a worker: <log_dir>/<run_id>_<random>/attempt_N/L/stacks.txt."""
    found = sorted(pathlib.Path(log_dir).glob(f"*/attempt_{attempt}/{local_rank}/stacks.txt"))
    assert len(found) <= 1, found
    return found[0] if found else None


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
