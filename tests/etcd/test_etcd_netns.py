"""`ddprun --rdzv-backend=etcd` with nodes as truly separate hosts: one network namespace per
node, joined by veth pairs to a bridge that also carries the root namespace's address, where
etcd listens. A gloo job across two hosts; a host that vanishes (its link goes down: no FIN, no
RST, its agent cannot revoke its lease) is noticed when its lease expires (TTL 1 s x 3), the
others re-form, and when the host comes back its agent stops its stale workers. Needs root and
`ip netns` (skipped otherwise); everything it creates is removed, whatever happens."""
import os
import subprocess

import pytest

from etcd_cluster import EtcdCluster
from netns_hosts import Hosts, ip, netns_unavailable  # noqa: F401
from etcd_helpers import (Cluster, all_dead, clean_env, etcd_flags, formed_re, gloo_loop,
                          pid_alive, records, seconds_until_gone, wait_running, wait_until,
                          worker)


UNAVAILABLE = netns_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


@pytest.fixture
def net(tmp_path, ddprun):
    """(hosts, etcd on the bridge, agents) torn down in reverse order."""
    made = []

    def make(n):
        h = Hosts(n, prefix="ddpe", net=214, root_addr=True)
        made.append(h)
        e = EtcdCluster(tmp_path, host=h.root_addr)
        made.append(e)
        e.start()
        c = Cluster(ddprun, tmp_path)
        made.append(c)
        return h, e, c

    yield make
    for thing in reversed(made):
        thing.close()


def test_gloo_job_across_two_hosts(net, tmp_path):
    h, etcd, cluster = net(2)
    d = tmp_path / "job"
    d.mkdir()
    # Gloo finds its own address from the host name (the same in every namespace).
    env = clean_env(GLOO_SOCKET_IFNAME="eth0")
    flags = etcd_flags(etcd.endpoint_arg(), 2, "hosts", nproc=2)
    agents = [cluster.agent(flags, gloo_loop(), "--dir", d, "--max-steps", "20", "--delay",
                            "0.01", addr=h.addr(i), netns=h.names[i], env=env) for i in (1, 0)]
    for a in agents:
        assert a.wait(120) == 0, a.log()
    start = records(d / "start.jsonl")
    assert {r["MASTER_ADDR"] for r in start} == {h.addr(0)}
    assert sorted(int(r["RANK"]) for r in start) == [0, 1, 2, 3]
    assert {(e["steps"], e["world"]) for e in records(d / "end.jsonl")} == {(20, 4)}
    assert formed_re("hosts", 0, 2, world=4).search(agents[1].log()), agents[1].log()


def test_vanished_host_is_noticed_when_its_lease_expires(net, tmp_path):
    h, etcd, cluster = net(3)
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd.endpoint_arg(), "2:3", "vanish")  # lease TTL 1 s x 3
    agents = [cluster.agent(flags, worker("record.py"), log, "--wait-for", go, addr=h.addr(i),
                            netns=h.names[i]) for i in range(3)]
    first = wait_running(agents, lambda: len(records(log)) == 3 and records(log),
                         "the 3-node group")
    lost = next(r["pid"] for r in first if r["GROUP_RANK"] == "2")
    h.cut(2)  # the naturally largest address: node rank 2
    took = seconds_until_gone(agents[:2])
    assert 1.5 <= took <= 12, f"a vanished host was noticed after {took:.1f} s (lease TTL 3 s)"
    recs = wait_running(agents[:2], lambda: len(records(log)) == 5 and records(log),
                        "the survivors' group")
    assert {r["GROUP_WORLD_SIZE"] for r in recs[3:]} == {"2"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    for a in agents[:2]:
        assert formed_re("vanish", r"\d", 2, again=True).search(a.log()), a.log()
    # Cut off from etcd, the lost host's agent keeps its workers running (etcd might come
    # back)...
    assert agents[2].running() and pid_alive(lost), agents[2].log()
    # ...and once back, finds its lease gone: it stops them, then rejoins as a new node, or
    # leaves without disturbing the others.
    h.restore(2)
    assert all_dead([lost], timeout=30), "the lost host ran on in a round that had ended:\n" \
        + agents[2].log()
    what = wait_until(lambda: ("rejoined" if len(records(log)) == 8
                               else "left" if not agents[2].running() else None),
                      "the lost host to leave or rejoin", timeout=60)
    go.touch()
    for a in agents[:2]:
        assert a.wait(60) == 0, a.log()
    code = agents[2].wait(60)
    if what == "left":  # before the job was done, and without disturbing the others
        assert code != 0, agents[2].log()
        assert len(records(log)) == 5, "the survivors re-formed again for a node that left:\n" \
            + agents[0].log() + agents[2].log()
    else:  # as a third node: a scale-up, no restart spent
        assert code == 0, agents[2].log()
        recs = records(log)
        assert {r["GROUP_WORLD_SIZE"] for r in recs[5:]} == {"3"}
        assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
