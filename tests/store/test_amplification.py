"""A client that asks for large replies and never reads them cannot make a store hold them.

One SET of an 8 MiB value, then pipelined GETs of it that are never read: torch's servers, and
ddpstore before the output budget, built every reply (64 GETs of 1.7 KB made 512 MiB) and a
handful of such connections had a store in a 1 GiB memory cgroup killed by the OOM killer.
Here ddpstore runs in a memory cgroup far smaller than what the clients ask for, and must stay
alive, stay small, close the one connection whose single reply exceeds the whole budget, and
keep serving a well-behaved client. The workers' store that ddprun hosts is the same server: a
job's agent is tested the same way through the job's MASTER_PORT."""
import os
import pathlib
import re
import socket
import struct
import subprocess
import sys
import time

import pytest
from conftest import SOURCE_DIR, wait_for

from store_helpers import V2, Conn, ddpstore_running, keys, op, raise_fd_limit, s, u64

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup/memory")
VALUE = 8 << 20
ATTACKERS = 40  # x 64 GETs of 8 MiB: 20 GiB of replies asked for, 320 MiB queued at once


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) / 1024


@pytest.fixture
def memory_cgroup(tmp_path):
    """A cgroup v1 memory controller group of 640 MiB for the store (root only)."""
    if not os.access(CGROUP_ROOT, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory controller (root)")
    group = CGROUP_ROOT / f"ddprun-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(640 << 20))
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (CGROUP_ROOT / "cgroup.procs").write_text(pid)
        group.rmdir()


def oom_kills(group):
    text = (group / "memory.oom_control").read_text()
    m = re.search(r"oom_kill (\d+)", text)
    return int(m.group(1)) if m else 0


def attack(port):
    """One big value, then connections that ask for it over and over and never read (the
    first of them reads later, with a normal receive window)."""
    setter = Conn(port, torch2=True)
    setter.send(op(V2, "SET", s("big"), s(b"x" * VALUE)) + op(V2, "GETNUMKEYS"))
    assert setter.recv_i64() >= 1
    greedy = []
    for i in range(ATTACKERS):
        c = Conn(port, torch2=True)
        if i > 0:  # small windows: the kernel holds little, the store must hold the rest
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.send(b"".join(op(V2, "GET", s("big")) for _ in range(64)))
        greedy.append(c)
    # One request whose reply alone (256 x 8 MiB) is larger than the whole budget.
    huge = Conn(port, torch2=True)
    huge.send(op(V2, "MULTI_GET", keys(*["big"] * 256)))
    return setter, greedy, huge


def read_values(conn, n):
    """Reads n length-prefixed replies; returns their lengths."""
    conn.sock.settimeout(60)
    buf = bytearray(1 << 20)
    lengths = []
    for _ in range(n):
        length = struct.unpack("<Q", conn.recv(8))[0]
        left = length
        while left:
            got = conn.sock.recv_into(buf, min(left, len(buf)))
            assert got, "closed mid-reply"
            left -= got
        lengths.append(length)
    return lengths


def well_behaved(port):
    c = Conn(port, torch2=True, timeout=10)
    c.send(op(V2, "SET", s("ok"), s("fine")) + op(V2, "GET", s("ok")))
    assert c.recv_bytes() == b"fine"
    c.close()


def test_ddpstore_holds_unread_replies_to_its_budget(ddpstore, tmp_path, memory_cgroup):
    raise_fd_limit()
    with ddpstore_running(ddpstore, tmp_path) as store:
        (memory_cgroup / "cgroup.procs").write_text(str(store.proc.pid))
        setter, greedy, huge = attack(store.port)
        assert huge.closed_by_peer(timeout=20), "the over-budget MULTI_GET was not refused"
        time.sleep(1.0)  # every greedy connection's requests have arrived and been looked at
        well_behaved(store.port)
        assert store.proc.poll() is None, store.log()
        assert oom_kills(memory_cgroup) == 0
        # 256 MiB of budget, 64 KiB per connection, a few MiB of buffers and the stored value.
        assert rss_mib(store.proc.pid) < 320, rss_mib(store.proc.pid)
        log = store.log()
        assert "exceeds the server's whole output budget" in log, log
        assert "(the output budget, ddpstore --max-output-bytes)" in log, log
        # A greedy client that starts reading gets every reply, in order, complete.
        assert read_values(greedy[0], 64) == [VALUE] * 64
        # The budget is full of replies nobody reads: a newcomer's large reply waits until the
        # connections that hold them and read nothing for 10 s are closed. (What greedy[0]'s
        # reading freed is usually taken back by the other greedy connections first; when the
        # newcomer gets there first, its reply needs no closing.)
        late = Conn(store.port, torch2=True, timeout=60)
        asked = time.monotonic()
        late.send(op(V2, "GET", s("big")))
        assert read_values(late, 1) == [VALUE]
        if time.monotonic() - asked >= 5:
            assert "connection(s) that read none of" in store.log(), store.log()
        for c in greedy + [setter]:
            c.close()
        well_behaved(store.port)


def test_over_budget_flag_is_refused(ddpstore):
    r = subprocess.run([ddpstore, "--max-output-bytes", "1000"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2
    assert "--max-output-bytes 1000 is less than one reply of the longest value" in r.stderr


WORKER = r"""
import os, sys, time
print("PORT", os.environ["MASTER_PORT"], flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_agent_hosted_store_holds_unread_replies_to_its_budget(ddprun, tmp_path):
    raise_fd_limit()
    worker = tmp_path / "w.py"
    worker.write_text(WORKER)
    job = subprocess.Popen([ddprun, "--standalone", "--nproc-per-node=1", "--tee", "3",
                            "--log-dir", str(tmp_path / "logs"), str(worker), "8"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHON_EXEC": sys.executable})
    try:
        line = ""
        while "PORT" not in line:
            line = job.stdout.readline()
            assert line, job.stderr.read()
        port = int(line.split()[-1])
        setter, greedy, huge = attack(port)
        assert huge.closed_by_peer(timeout=20)
        time.sleep(1.0)
        well_behaved(port)
        assert rss_mib(job.pid) < 320, rss_mib(job.pid)
        for c in greedy + [setter]:
            c.close()
        assert job.wait(timeout=60) == 0, job.stderr.read()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
