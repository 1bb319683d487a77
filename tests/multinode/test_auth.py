"""Closed to strangers: a multi-node job whose rendezvous store asks for a token
(--rdzv-conf token_file=PATH, ddpstore --token-file PATH) and whose workers' store admits only
loopback and the round's members. Real agents, real torch gloo workers; while they run, an
agent with the wrong token, a raw client sending a torch SET frame and a torch TCPStore client
from a non-member address are all refused, and the job still finishes with exit 0 and no
restart spent."""
import os
import re
import socket
import struct
import subprocess

import pytest

from mn_helpers import (FAST_CONF, TORCH1_PYTHON, c10d_flags, clean_env, free_port,
                        records, wait_until, worker)


def token_file(tmp_path, name, secret, mode=0o600):
    path = tmp_path / name
    path.write_text(secret + "\n")
    os.chmod(path, mode)
    return path


def conf_with(token=None, is_host=None):
    conf = FAST_CONF
    if token:
        conf += f",token_file={token}"
    if is_host is not None:
        conf += f",is_host={'true' if is_host else 'false'}"
    return conf


def torch1_set_frame():
    """What torch 1.13's TCPStore client sends for set('/k', 'v')."""
    return b"\x00" + struct.pack("<Q", 2) + b"/k" + struct.pack("<Q", 1) + b"v"


def closed_at_once(host, port, payload, source=None):
    """Connects (from `source` if given), sends payload; the local port once the peer closed
    the connection without a byte of reply, None if it answered or stayed open for 10 s."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        if source:
            s.bind((source, 0))
        s.connect((host, port))
        local = s.getsockname()[1]
        try:
            s.sendall(payload)
            data = s.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            return local
        except socket.timeout:
            return None
        return local if data == b"" else None


TORCH_PROBE = """
import datetime, sys
import torch.distributed as dist
try:
    s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False,
                      timeout=datetime.timedelta(seconds=5))
    s.set("probe", "1")
    print("SERVED", s.get("probe"))
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


def torch_probe(host, port, netns=None):
    """A torch 1.13 TCPStore client (/usr/bin/python3) against host:port: 'SERVED ...' or
    'REFUSED ...'."""
    cmd = [TORCH1_PYTHON, "-c", TORCH_PROBE, host, str(port)]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean_env())
    return r.stdout.strip() + r.stderr[-2000:]


def test_token_job_refuses_strangers_and_finishes(cluster, tmp_path):
    good = token_file(tmp_path, "token", "the job's secret")
    bad = token_file(tmp_path, "other", "another secret")
    port = free_port()
    ep = f"127.0.0.2:{port}"
    log, go = tmp_path / "log", tmp_path / "go"
    flags = lambda conf: c10d_flags(ep, 2, "closed", conf=conf, nproc=2)
    host = cluster.agent(flags(conf_with(good, is_host=True)), worker("gloo_hold.py"), log, go,
                         addr="127.0.0.2")
    other = cluster.agent(flags(conf_with(good, is_host=False)), worker("gloo_hold.py"), log, go,
                          addr="127.0.0.3")
    started = wait_until(lambda: len(records(log)) == 4 and records(log), "4 gloo workers",
                         timeout=120)
    assert {r["WORLD_SIZE"] for r in started} == {"4"}
    master = {(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in started}
    assert len(master) == 1
    master_addr, master_port = master.pop()
    assert master_addr == "127.0.0.2"  # the host node is node rank 0: its agent logs below

    # (b) A raw client sending a torch SET frame to the rendezvous store is closed and logged.
    local = closed_at_once("127.0.0.2", port, torch1_set_frame())
    assert local, "the rendezvous store answered a client without a token"
    wait_until(lambda: f"refused 127.0.0.1:{local}: no token" in host.log(),
               "the rendezvous store's refusal line")

    # (a) An agent with another secret is refused, at once, with a clear line.
    wrong = cluster.agent(flags(conf_with(bad, is_host=False)), worker("gloo_hold.py"), log, go,
                          addr="127.0.0.4")
    assert wrong.wait(60) != 0, wrong.log()
    assert f"the rendezvous store at {ep} did not prove it knows the token" in wrong.log()
    wait_until(lambda: "refused 127.0.0.1:" in host.log() and ": wrong token" in host.log(),
               "the store's line about the wrong token")
    # An agent without a token learns why, at once.
    none = cluster.agent(flags(conf_with(is_host=False)), worker("gloo_hold.py"), log, go,
                         addr="127.0.0.5")
    assert none.wait(60) != 0, none.log()
    assert f"the rendezvous store at {ep} asks for a token" in none.log()

    # (c) The workers' store: a client from a non-member address (a loopback alias no node
    # advertises) is closed right after accept; a local torch client is served.
    local = closed_at_once(master_addr, int(master_port), torch1_set_frame(), source="127.0.0.9")
    assert local, "the workers' store served a non-member"
    wait_until(lambda: re.search(r"\[ddprun workers' store\] \S+ refused "
                                 rf"127\.0\.0\.9:{local}: not a member of round 0", host.log()),
               "the workers' store's refusal line")
    assert torch_probe(master_addr, master_port).startswith("SERVED"), "loopback refused"

    go.touch()
    assert host.wait(120) == 0, host.log()
    assert other.wait(120) == 0, other.log()
    recs = records(log)
    assert sorted(r["sum"] for r in recs if "sum" in r) == [6.0] * 4
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs if "RANK" in r} == {"0"}
    for a in (host, other):
        assert "job summary: 1 attempt, 0 restarts, 0 re-formations" in a.log(), a.log()
        assert "accepts any client" not in a.log()


def test_ddpstore_with_a_token_serves_two_agents(cluster, tmp_path, ddpstore):
    good = token_file(tmp_path, "token", "s3cret")
    store, port = cluster.ddpstore(ddpstore, "--token-file", good)
    ep = f"127.0.0.1:{port}"
    log = tmp_path / "log"
    flags = c10d_flags(ep, 2, "pair", conf=conf_with(good))
    agents = [cluster.agent(flags, worker("record.py"), log, addr=f"127.0.0.{i + 2}")
              for i in range(2)]
    for a in agents:
        assert a.wait(120) == 0, a.log()
    assert len(records(log)) == 2
    # Without the token: refused at once; the store says so.
    late = cluster.agent(c10d_flags(ep, 2, "pair"), worker("record.py"), log, addr="127.0.0.4")
    assert late.wait(60) == 1, late.log()
    assert f"the rendezvous store at {ep} asks for a token: give this node --rdzv-conf " \
           "token_file=PATH" in late.log()
    wait_until(lambda: re.search(r"\[ddpstore\] \S+ refused 127\.0\.0\.1:\d+: no token",
                                 store.log()), "ddpstore's refusal line")
    assert "accepts any client" not in store.log()
    assert store.running()


def test_agent_with_a_token_refuses_an_open_store(cluster, tmp_path, ddpstore):
    good = token_file(tmp_path, "token", "s3cret")
    _, port = cluster.ddpstore(ddpstore)
    a = cluster.agent(c10d_flags(f"127.0.0.1:{port}", 2, "open", conf=conf_with(good)),
                      worker("record.py"), tmp_path / "log", addr="127.0.0.2")
    assert a.wait(60) == 1, a.log()
    assert f"the rendezvous store at 127.0.0.1:{port} does not ask for a token (started " \
           "without --token-file?)" in a.log()


def test_token_file_problems(ddprun, ddpstore, tmp_path):
    from testenv import run
    missing = tmp_path / "missing"
    empty = token_file(tmp_path, "empty", "")
    flags = ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:1",
             "--rdzv_id=x"]
    for path, what in ((missing, "No such file or directory"), (empty, "is empty")):
        r = run([ddprun, *flags, f"--rdzv_conf=token_file={path}", "/bin/true"], timeout=30)
        assert r.returncode == 2, r.stderr
        errors = [l for l in r.stderr.splitlines() if "error" in l]
        assert len(errors) == 1 and str(path) in errors[0] and what in errors[0], r.stderr
        r = run([ddpstore, "--port", "0", "--token-file", path], timeout=30)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.splitlines()) == 1 and str(path) in r.stderr, r.stderr
    # Readable by others: one warning line, and the store serves anyway.
    shared = token_file(tmp_path, "shared", "s3cret", mode=0o644)
    p = subprocess.Popen([ddpstore, "--host", "127.0.0.1", "--port", "0", "--token-file", shared],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on 127.0.0.1:" in p.stdout.readline()
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    warnings = [l for l in err.splitlines() if "warning" in l]
    assert len(warnings) == 1 and f"chmod 600 {shared}" in warnings[0], err


def test_open_store_beyond_loopback_warns(ddpstore):
    p = subprocess.Popen([ddpstore, "--host", "0.0.0.0", "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert "listening on 0.0.0.0:" in line
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert "accepts any client that reaches it; give every node --rdzv-conf token_file=PATH " \
           "(and ddpstore --token-file PATH)" in err, err


# Nodes as separate hosts (network namespaces): a torch TCPStore client on a third host that
# is not a member of the round is refused by the workers' store.
from netns_hosts import Hosts, netns_unavailable  # noqa: E402
@pytest.fixture
def hosts():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    h = Hosts(3)
    yield h
    h.close()


def test_torch_client_from_a_non_member_host_is_refused(hosts, cluster, tmp_path):
    good = token_file(tmp_path, "token", "s3cret")
    port = free_port()
    ep = f"{hosts.addr(0)}:{port}"
    log, go = tmp_path / "log", tmp_path / "go"
    env = clean_env(GLOO_SOCKET_IFNAME="eth0")
    agents = [cluster.agent(c10d_flags(ep, 2, "netns", conf=conf_with(good, is_host=i == 0),
                                       nproc=1),
                            worker("gloo_hold.py"), log, go, addr=hosts.addr(i),
                            netns=hosts.names[i], env=env) for i in (0, 1)]
    started = wait_until(lambda: len(records(log)) == 2 and records(log), "2 gloo workers",
                         timeout=120)
    (master_addr, master_port), = {(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in started}
    assert master_addr == hosts.addr(0)
    # From host 2 (no member): refused right after accept. From host 1 (a member): served.
    assert torch_probe(master_addr, master_port, netns=hosts.names[2]).startswith("REFUSED")
    stranger = re.escape(hosts.addr(2))
    wait_until(lambda: re.search(rf"refused {stranger}:\d+: not a member of round 0",
                                 agents[0].log()), "the workers' store's refusal line")
    assert torch_probe(master_addr, master_port, netns=hosts.names[1]).startswith("SERVED")
    # And the rendezvous store refuses a torch client from anywhere: it has no token.
    assert torch_probe(hosts.addr(0), port, netns=hosts.names[2]).startswith("REFUSED")
    go.touch()
    for a in agents:
        assert a.wait(120) == 0, a.log()
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in records(log) if "RANK" in r} == {"0"}
