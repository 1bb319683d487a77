"""The three-member scenarios shared by test_etcd_ha.py (members stopped) and
test_etcd_frozen.py (members frozen): each takes the signal that takes the member away,
SIGKILL or SIGSTOP. The member that goes away is listed first in the agents'
--rdzv-endpoint, so that it is the one they talk to."""
import signal
import time

from etcd_helpers import (etcd_flags, formed_re, gloo_loop, records, seconds_until_gone,
                          steps_done, wait_running, worker)


def two_gloo_nodes(etcd3, cluster, d, run_id, order):
    flags = etcd_flags(etcd3.endpoint_arg(order), 2, run_id)
    agents = [cluster.agent(flags, gloo_loop(), "--dir", d, "--stop-file", d / "stop",
                            addr=f"127.0.0.{i + 2}") for i in range(2)]
    wait_running(agents, lambda: steps_done(d, world=2) >= 5, "the 2-node job to train",
                 timeout=120)
    return agents


def check_undisturbed(agents, d, quiet_s):
    """The job trains on through quiet_s seconds (longer than the lease TTL of 3 s), then
    finishes 0 in its first round: no node was declared gone, no restart, no re-formation."""
    before = steps_done(d, world=2)
    time.sleep(quiet_s)  # what must not happen has no event to wait for
    assert steps_done(d, world=2) >= before + 10, "training stalled"
    assert all(a.running() for a in agents), [a.log() for a in agents]
    (d / "stop").touch()
    for a in agents:
        assert a.wait(60) == 0, a.log()
        assert " is gone" not in a.log() and "re-formed in" not in a.log(), a.log()
    start, end = records(d / "start.jsonl"), records(d / "end.jsonl")
    assert len(start) == 2, start
    assert {(e["world"], e["TORCHELASTIC_RESTART_COUNT"]) for e in end} == {(2, "0")}, end


def job_survives_losing_a_member(etcd3, cluster, tmp_path, leader, sig):
    """A running 2-node gloo job loses its agents' member (the leader, or a follower) and
    goes on undisturbed: the agents move to another member before their leases (TTL 3 s)
    run out."""
    d = tmp_path / "job"
    d.mkdir()
    first = etcd3.leader_index()
    victim = first if leader else (first + 1) % 3
    agents = two_gloo_nodes(etcd3, cluster, d, "lose-member",
                            [victim] + [i for i in range(3) if i != victim])
    if leader:
        victim = etcd3.leader_index()
    etcd3.stop_member(victim, sig)
    assert etcd3.leader_index() != victim
    check_undisturbed(agents, d, quiet_s=6)


def node_death_while_a_member_is_down(etcd3, cluster, tmp_path, sig):
    """The agents' member goes away, then a node is killed: the survivors still hear of it
    (its guardian revokes its lease through another member; at worst the lease expires after
    3 s) and re-form."""
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd3.endpoint_arg(), "2:3", "degraded")
    agents = [cluster.agent(flags, worker("record.py"), log, "--wait-for", go,
                            addr=f"127.0.0.{i + 2}") for i in range(3)]
    first = wait_running(agents, lambda: len(records(log)) == 3 and records(log),
                         "the 3-node group")
    etcd3.stop_member(0, sig)
    agents[2].kill(signal.SIGKILL)
    took = seconds_until_gone(agents[:2])
    recs = wait_running(agents[:2], lambda: len(records(log)) == 5 and records(log),
                        "the 2-node group")
    assert {r["GROUP_WORLD_SIZE"] for r in recs[3:]} == {"2"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert not any(r["pid"] in {x["pid"] for x in recs[3:]} for r in first)
    go.touch()
    for a in agents[:2]:
        assert a.wait(60) == 0, a.log()
        assert formed_re("degraded", r"\d", 2, again=True).search(a.log()), a.log()
    assert took < 10, f"the death was noticed after {took:.1f} s (lease TTL 3 s)"


def list_whose_first_member_is_down_forms(etcd3, cluster, tmp_path, sig):
    """Two nodes form, in one round (no lease lost on the way, no node seen as gone), with
    the first member of their list gone."""
    etcd3.stop_member(0, sig)
    etcd3.wait_healthy()
    flags = etcd_flags(etcd3.endpoint_arg(), 2, "first-down")
    agents = [cluster.agent(flags, worker("record.py"), tmp_path / "log",
                            addr=f"127.0.0.{i + 2}") for i in range(2)]
    for a in agents:
        assert a.wait(60) == 0, a.log()
        assert " is gone" not in a.log() and "re-formed in" not in a.log(), a.log()
    assert formed_re("first-down", 0, 2).search(agents[0].log()), agents[0].log()
    assert sorted(r["RANK"] for r in records(tmp_path / "log")) == ["0", "1"]
