"""Nodes as truly separate hosts: one network namespace per node, joined by veth pairs on a
bridge, each node reachable only at its own address. A static gloo job across them; an elastic
job whose third host vanishes without closing its connections (its link goes down: no FIN,
no RST) is noticed through keep-alive, the survivors re-form, and the cut-off node stops its
workers on its own. Needs root and `ip netns` (skipped otherwise); everything it creates is
removed, whatever happens."""
import json
import os
import re
import subprocess

import pytest

from netns_hosts import Hosts, ip, netns_unavailable  # noqa: F401
from mn_helpers import (EXAMPLES, SOURCE_DIR, all_dead, c10d_flags, clean_env, free_port,
                        records, wait_until, worker)
from jobs import closing_all


UNAVAILABLE = netns_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


@pytest.fixture
def hosts():
    yield from closing_all(Hosts)


@pytest.mark.parametrize("via_proxy", [False, True], ids=["direct", "store-proxy"])
def test_static_gloo_job_across_two_hosts(hosts, cluster, tmp_path, via_proxy):
    h = hosts(2)
    port = free_port()
    out = tmp_path / "result.json"
    flags = lambda r: ["--nnodes=2", f"--node_rank={r}", "--nproc_per_node=2",
                       f"--master_addr={h.addr(0)}", f"--master_port={port}",
                       "--store-proxy", "on" if via_proxy else "off"]
    # Gloo finds its own address from the host name (the same in every namespace, and on
    # loopback here); real hosts resolve theirs, namespaces name the interface.
    env = clean_env(GLOO_SOCKET_IFNAME="eth0")
    nodes = [cluster.agent(flags(r), str(EXAMPLES / "ddp_gloo.py"), "--out", out,
                           addr=h.addr(r), netns=h.names[r], env=env) for r in (1, 0)]
    for p in nodes:
        assert p.wait(180) == 0, p.log()
    result = json.loads(out.read_text())
    assert result["world_size"] == 4
    assert result["rank_sum"] == 10.0
    # With --store-proxy each node's workers reached the store through their own agent.
    for p in nodes:
        assert ("workers through this node's store proxy on 127.0.0.1:" in p.log()) == via_proxy


def test_vanished_host_is_noticed_by_keep_alive(hosts, cluster, tmp_path, ddpstore):
    h = hosts(4)  # host 0: the ddpstore; hosts 1-3: the nodes
    _, port = cluster.ddpstore(ddpstore, host=h.addr(0), netns=h.names[0])
    log, go = tmp_path / "log", tmp_path / "go"
    conf = ("join_timeout=60,last_call_timeout=1,close_timeout=10,keep_alive_interval=1,"
            "keep_alive_max_attempt=2")
    flags = c10d_flags(f"{h.addr(0)}:{port}", "2:3", "vanish", conf=conf)
    agents = [cluster.agent(flags, worker("record.py"), log, "--wait-for", go, addr=h.addr(i),
                            netns=h.names[i]) for i in (1, 2, 3)]
    first = wait_until(lambda: len(records(log)) == 3 and records(log), "the 3-node group")
    assert {r["GROUP_WORLD_SIZE"] for r in first} == {"3"}
    lost = next(r for r in first if r["GROUP_RANK"] == "2")
    h.cut(3)  # host 3 (the naturally largest address: node rank 2) is gone
    recs = wait_until(lambda: len(records(log)) == 5 and records(log), "the survivors' group",
                      timeout=60)
    second = recs[3:]
    assert {r["GROUP_WORLD_SIZE"] for r in second} == {"2"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in second} == {"0"}
    assert "is gone (its connection to the store closed)" in agents[0].log()
    # The cut-off node loses the store the same way, stops its worker and exits.
    assert agents[2].wait(60) == 1, agents[2].log()
    assert re.search(r"lost the rendezvous store at .*; workers stopped", agents[2].log()), \
        agents[2].log()
    assert all_dead([lost["pid"]])
    go.touch()
    for a in agents[:2]:
        assert a.wait(60) == 0, a.log()


def test_collective_hang_across_two_hosts_names_the_same_culprit(hosts, cluster, tmp_path):
    """Rank 1 (host 1) skips an all_reduce rank 0 (host 0) waits in: both hosts exchange their
    evidence (flight recorders of warm torch 2.x workers) through the rendezvous store and print
    the same line (docs/hangs-health-events.md)."""
    from conftest import TORCH2_PYTHON
    h = hosts(2)
    port = free_port()
    out = tmp_path / "result.json"
    flags = [*c10d_flags(f"{h.addr(0)}:{port}", 2, "hangjob", max_restarts=1),
             "--hang-timeout=3", "--warm-start=on"]
    env = clean_env(python=TORCH2_PYTHON, GLOO_SOCKET_IFNAME="eth0",
                    PATH=os.path.dirname(TORCH2_PYTHON) + os.pathsep + os.environ["PATH"])
    skip = str(SOURCE_DIR / "tests" / "hang" / "workers" / "skip_collective.py")
    nodes = [cluster.agent(flags, skip, "--out", out, addr=h.addr(r), netns=h.names[r], env=env)
             for r in (0, 1)]
    for p in nodes:
        assert p.wait(240) == 0, p.log()
    assert json.loads(out.read_text())["attempt"] == 1
    lines = [re.search(r"collective hang: (.*)", p.log()) for p in nodes]
    assert all(lines), [p.log() for p in nodes]
    assert lines[0].group(1) == lines[1].group(1)
    assert re.fullmatch(r"collective #5 all_reduce \(4\.0 kB, pg 0\): rank 0 waiting [\d.]+ s; "
                        r"rank 1 \([^,]+, pid \d+\) never entered it \(its last: #4 all_reduce\)",
                        lines[0].group(1)), lines[0].group(1)
