"""`ddprun --rdzv-backend=etcd` on a three-member etcd whose member the agents use freezes
(SIGSTOP): its connections stay open, the kernel still accepts new ones and answers TCP
keep-alive, and nothing is ever answered, as when its host hangs or its disk stalls. The
agents must give up on it in time to keep their leases (TTL 1 s x 3): a running job goes on
undisturbed, a node's death is still noticed, and a list whose first member is frozen
forms in one round. (The same scenarios with stopped members: test_etcd_ha.py.) A single
member frozen for longer than the lease TTL ends every lease at once: no node loss either."""
import signal
import time

from etcd_helpers import (all_dead, etcd_flags, kill_tree, pid_alive, records, wait_running,
                          worker)
from ha_scenarios import (job_survives_losing_a_member, list_whose_first_member_is_down_forms,
                          node_death_while_a_member_is_down)

# What each agent says once every node whose lease ended with etcd's absence is back.
NOT_A_LOSS = "not a node loss; every node re-registered"


def test_running_job_survives_its_member_freezing(etcd3, cluster, tmp_path):
    job_survives_losing_a_member(etcd3, cluster, tmp_path, True, signal.SIGSTOP)


def test_node_death_while_a_member_is_frozen(etcd3, cluster, tmp_path):
    node_death_while_a_member_is_down(etcd3, cluster, tmp_path, signal.SIGSTOP)


def test_list_whose_first_member_is_frozen_still_forms(etcd3, cluster, tmp_path):
    list_whose_first_member_is_down_forms(etcd3, cluster, tmp_path, signal.SIGSTOP)


def test_etcd_frozen_longer_than_the_lease_ttl_is_no_node_loss(etcd, cluster, tmp_path):
    """The only etcd member freezes for twice the lease TTL (1 s x 3) under a running 2-node
    job. When it thaws, every lease has expired at once and etcd deletes every will: that is
    the store's absence, not a node loss. Each agent takes a new lease, writes its will again
    (naming the same node), and the others, whose own lease ended too, wait for it instead of
    applying its will: the workers are never stopped, nothing re-forms, the job ends with 0."""
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd.endpoint_arg(), 2, "frozen-ttl")
    agents = [cluster.agent(flags, worker("record.py"), log, "--wait-for", go,
                            addr=f"127.0.0.{i + 2}") for i in range(2)]
    first = wait_running(agents, lambda: len(records(log)) == 2 and records(log),
                         "the 2-node group")
    pids = [r["pid"] for r in first]
    time.sleep(2)  # a few keep-alives answered on time
    etcd.stop_member(0, signal.SIGSTOP)
    time.sleep(6)  # 2 x the TTL: every lease ends
    etcd.start_member(0)
    thawed = time.monotonic()
    # Either every agent says the others re-registered, or (the defect) a node is seen as
    # gone and the group re-forms: stop waiting at whichever comes first.
    settled = lambda a: NOT_A_LOSS in a.log()
    reformed = lambda: len(records(log)) > 2 or any(" is gone" in a.log() for a in agents)
    wait_running(agents, lambda: all(settled(a) for a in agents) or reformed(),
                 "the agents to re-register", timeout=30)
    took = time.monotonic() - thawed
    assert not reformed(), "\n".join(a.log() for a in agents)
    print(f"every agent re-registered {took:.1f} s after etcd thawed")
    # Nothing applies a will later either: wait out a grace (TTL + 2 intervals = 5 s).
    time.sleep(6)
    assert all(a.running() for a in agents), "\n".join(a.log() for a in agents)
    assert records(log) == first, "\n".join(a.log() for a in agents)
    assert all(pid_alive(p) for p in pids), "a worker was stopped"
    for a in agents:
        text = a.log()
        assert "expired (no answer from etcd for longer than its TTL)" in text, text
        assert text.count(": started 1 worker(s)") == 1, text
        for bad in (" is gone", "re-form", "attempt 1", "lost the rendezvous store"):
            assert bad not in text, text
    # Both nodes hold a live will again (under their new leases).
    assert len([k for k in etcd.keys("/ddprun/frozen-ttl/will/")]) == 2, etcd.keys("/ddprun/")
    go.touch()
    for a in agents:
        assert a.wait(60) == 0, a.log()
    assert len(records(log)) == 2


def test_node_that_dies_while_etcd_is_frozen_is_still_noticed(etcd, cluster, tmp_path):
    """The same freeze, and a node (its whole process tree) dies during it: its lease ended
    with everyone's, but it never writes its will again, so once the grace (TTL + 2 intervals
    = 5 s after etcd answers again) is over the survivors apply its will and re-form without
    it, spending no restart."""
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd.endpoint_arg(), "2:3", "frozen-death")
    agents = [cluster.agent(flags, worker("record.py"), log, "--wait-for", go,
                            addr=f"127.0.0.{i + 2}") for i in range(3)]
    wait_running(agents, lambda: len(records(log)) == 3, "the 3-node group")
    time.sleep(2)
    etcd.stop_member(0, signal.SIGSTOP)
    killed = kill_tree(agents[0])
    time.sleep(6)
    etcd.start_member(0)
    thawed = time.monotonic()
    survivors = agents[1:]
    wait_running(survivors, lambda: all(" is gone" in a.log() for a in survivors),
                 "the survivors to notice the lost node", timeout=30)
    took = time.monotonic() - thawed
    print(f"the dead node was noticed {took:.1f} s after etcd thawed")
    assert all_dead(killed)
    recs = wait_running(survivors, lambda: len(records(log)) == 5 and records(log),
                        "the survivors' group")
    assert {r["GROUP_WORLD_SIZE"] for r in recs[3:]} == {"2"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    go.touch()
    for a in survivors:
        assert a.wait(60) == 0, a.log()
        assert "did not re-register within 5 s: applying its will" in a.log(), a.log()
        assert "re-forming the worker group without spending a restart" in a.log(), a.log()
    # Not before the grace (the node might have come back), not much after it.
    assert 4 < took < 15, f"the dead node was noticed {took:.1f} s after etcd thawed"
