"""`ddprun --rdzv-backend=etcd` on a one-member etcd: real agents as separate nodes (their own
--local-addr on loopback), real PyTorch gloo workers where the job matters, tests/multinode's
record.py where only the rendezvous does. The same semantics as the c10d backend: formation,
last call and scale-up, a node's death, the job-wide restart budget, spares, a closed job,
separate job ids, the etcd-v2 and etcd-v3 aliases and an unreachable endpoint."""
import re
import signal
import socket
import time

import pytest

from etcd_helpers import (FAST_CONF, all_dead, etcd_flags, formed_re, free_port, gloo_loop,
                          kill_tree, records, seconds_until_gone, steps_done, wait_running,
                          worker)
from testenv import SDK_BIN_DIR


def test_two_nodes_form_and_run_a_gloo_job(etcd, cluster, tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    flags = etcd_flags(etcd.endpoint_arg(), 2, "form", nproc=2)
    # 127.0.0.2 sorts first: node rank 0, MASTER_ADDR, the workers' store.
    agents = [cluster.agent(flags, gloo_loop(), "--dir", d, "--max-steps", "20",
                            "--delay", "0.01", addr=a) for a in ("127.0.0.3", "127.0.0.2")]
    wait_running(agents, lambda: len(records(d / "start.jsonl")) == 4, "the 4 workers")
    # Everything the job keeps in etcd is under /ddprun/<rdzv-id>/.
    keys = etcd.keys()
    assert keys and all(k.startswith("/ddprun/form/") for k in keys), sorted(keys)
    for a in agents:
        assert a.wait(120) == 0, a.log()
    start = records(d / "start.jsonl")
    assert sorted(int(r["RANK"]) for r in start) == [0, 1, 2, 3]
    assert {r["WORLD_SIZE"] for r in start} == {"4"}
    assert {r["GROUP_WORLD_SIZE"] for r in start} == {"2"}
    assert {r["MASTER_ADDR"] for r in start} == {"127.0.0.2"}
    assert {r["TORCHELASTIC_RUN_ID"] for r in start} == {"form"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in start} == {"0"}
    groups = {}
    for r in start:
        groups.setdefault(r["GROUP_RANK"], set()).add(r["RANK"])
    assert groups == {"0": {"0", "1"}, "1": {"2", "3"}}
    end = records(d / "end.jsonl")
    assert len(end) == 4 and {(e["steps"], e["world"]) for e in end} == {(20, 4)}
    assert formed_re("form", 0, 2, world=4).search(agents[1].log()), agents[1].log()
    assert formed_re("form", 1, 2, world=4).search(agents[0].log()), agents[0].log()


def test_last_call_then_scale_up_spends_no_restart(etcd, cluster, tmp_path):
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd.endpoint_arg(), "2:3", "grow", max_restarts=0)
    run = lambda addr: cluster.agent(flags, worker("record.py"), log, "--wait-for", go,
                                     addr=addr)
    agents = [run("127.0.0.10"), run("127.0.0.9")]
    # MIN=2 joined: they form after the last call (1 s) without waiting for MAX.
    first = wait_running(agents, lambda: len(records(log)) == 2 and records(log),
                         "the 2-node group")
    assert {r["GROUP_WORLD_SIZE"] for r in first} == {"2"}
    assert formed_re("grow", 0, 2).search(agents[1].log()), agents[1].log()
    agents.append(run("127.0.0.2"))
    recs = wait_running(agents, lambda: len(records(log)) == 5 and records(log),
                        "the 3-node group")
    second = recs[2:]
    assert {r["GROUP_WORLD_SIZE"] for r in second} == {"3"}
    assert sorted(r["GROUP_RANK"] for r in second) == ["0", "1", "2"]
    assert {r["MASTER_ADDR"] for r in second} == {"127.0.0.2"}  # natural order
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert all_dead([r["pid"] for r in first]), "the 2-node group's workers were not stopped"
    go.touch()
    for a in agents:
        assert a.wait(60) == 0, a.log()
    for a in agents[:2]:
        assert "re-forming the worker group without spending a restart" in a.log(), a.log()
        assert formed_re("grow", r"\d", 3, again=True).search(a.log()), a.log()


def three_gloo_nodes(etcd, cluster, d, conf, run_id):
    flags = etcd_flags(etcd.endpoint_arg(), "2:3", run_id, conf=conf)
    agents = [cluster.agent(flags, gloo_loop(), "--dir", d, "--stop-file", d / "stop",
                            addr=f"127.0.0.{i + 2}") for i in range(3)]
    wait_running(agents, lambda: steps_done(d, world=3) >= 5, "the 3-node job to train",
                 timeout=120)
    return agents


def check_reformed(survivors, d, run_id, victim_pids):
    """The survivors re-form as 2 nodes with no restart spent and finish the gloo job."""
    assert all_dead(victim_pids), "the killed node's workers outlived it"
    start = wait_running(survivors, lambda: len(records(d / "start.jsonl")) == 5
                         and records(d / "start.jsonl"), "the survivors' new workers")
    wait_running(survivors, lambda: steps_done(d, world=2) >= 3, "the 2-node job to train")
    (d / "stop").touch()
    for a in survivors:
        assert a.wait(60) == 0, a.log()
        assert "re-forming the worker group without spending a restart" in a.log(), a.log()
        assert formed_re(run_id, r"\d", 2, world=2, again=True).search(a.log()), a.log()
    assert {r["GROUP_WORLD_SIZE"] for r in start[3:]} == {"2"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in start} == {"0"}
    end = records(d / "end.jsonl")
    assert {(e["world"], e["TORCHELASTIC_RESTART_COUNT"]) for e in end} == {(2, "0")}


def test_killed_agent_is_noticed_at_once(etcd, cluster, tmp_path):
    """SIGKILL of the agent alone: its guardian revokes its lease, so the survivors notice in
    well under the lease's TTL (15 s here)."""
    d = tmp_path / "job"
    d.mkdir()
    conf = FAST_CONF.replace("keep_alive_interval=1", "keep_alive_interval=5")
    agents = three_gloo_nodes(etcd, cluster, d, conf, "agent-kill")
    victims = [r["pid"] for r in records(d / "start.jsonl") if r["GROUP_RANK"] == "0"]
    agents[0].kill(signal.SIGKILL)  # node rank 0: it also held the workers' store
    took = seconds_until_gone(agents[1:])
    assert took < 5, f"a killed agent was noticed after {took:.1f} s (lease TTL 15 s)"
    check_reformed(agents[1:], d, "agent-kill", victims)


def test_killed_node_is_noticed_by_its_lease(etcd, cluster, tmp_path):
    """SIGKILL of the node's whole process tree (agent, guardian, workers) at once, as a
    container or cgroup kill does: nothing of it can revoke its lease, which expires after
    1 s x 3. (Workers that talk to each other, unlike record.py, would see their peer's
    sockets close first and fail: a worker failure, which spends a restart.)"""
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd.endpoint_arg(), "2:3", "tree-kill")
    agents = [cluster.agent(flags, worker("record.py"), log, "--wait-for", go,
                            addr=f"127.0.0.{i + 2}") for i in range(3)]
    wait_running(agents, lambda: len(records(log)) == 3, "the 3-node group")
    killed = kill_tree(agents[0])  # node rank 0
    took = seconds_until_gone(agents[1:])
    assert took < 5, f"a killed node was noticed after {took:.1f} s (lease TTL 3 s)"
    assert all_dead(killed)
    recs = wait_running(agents[1:], lambda: len(records(log)) == 5 and records(log),
                        "the survivors' group")
    assert {r["GROUP_WORLD_SIZE"] for r in recs[3:]} == {"2"}
    assert {r["MASTER_ADDR"] for r in recs[3:]} == {"127.0.0.3"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    go.touch()
    for a in agents[1:]:
        assert a.wait(60) == 0, a.log()
        assert "re-forming the worker group without spending a restart" in a.log(), a.log()


def test_failing_worker_spends_the_job_wide_budget(etcd, cluster, tmp_path):
    log = tmp_path / "log"
    flags = etcd_flags(etcd.endpoint_arg(), 2, "doomed", max_restarts=1)
    agents = [cluster.agent(flags, worker("record.py"), log, "--fail-node", "1",
                            "--fail-attempts", "9", "--exit-code", "7", addr=f"127.0.0.{i + 1}")
              for i in range(2)]
    codes = [a.wait(120) for a in agents]
    assert codes == [1, 7], [a.log() for a in agents]  # node 1's root cause exit code
    recs = records(log)
    counts = sorted((r["TORCHELASTIC_RESTART_COUNT"], r["GROUP_RANK"]) for r in recs)
    assert counts == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], counts
    assert {r["TORCHELASTIC_MAX_RESTARTS"] for r in recs} == {"1"}
    assert "reported a failed worker and no restarts are left" in agents[0].log(), agents[0].log()
    assert "Root Cause (first observed failure)" in agents[1].log(), agents[1].log()


def test_spare_waits_then_replaces_a_dead_node(etcd, cluster, tmp_path):
    log, go = tmp_path / "log", tmp_path / "go"
    flags = etcd_flags(etcd.endpoint_arg(), 2, "spare")
    run = lambda addr: cluster.agent(flags, worker("record.py"), log, "--wait-for", go,
                                     addr=addr)
    agents = [run("127.0.0.2"), run("127.0.0.3")]
    first = wait_running(agents, lambda: len(records(log)) == 2 and records(log),
                         "the 2-node group")
    spare = run("127.0.0.4")
    # MAX is reached: the third node waits and the running group goes on undisturbed.
    time.sleep(3)
    assert spare.running(), spare.log()
    assert len(records(log)) == 2 and all(a.running() for a in agents)
    agents[0].kill(signal.SIGKILL)
    recs = wait_running([agents[1], spare], lambda: len(records(log)) == 4 and records(log),
                        "the group with the spare")
    second = recs[2:]
    assert {r["GROUP_WORLD_SIZE"] for r in second} == {"2"}
    assert {r["MASTER_ADDR"] for r in second} == {"127.0.0.3"}
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert all_dead([r["pid"] for r in first if r["GROUP_RANK"] == "0"])
    go.touch()
    for a in (agents[1], spare):
        assert a.wait(60) == 0, a.log()
    assert formed_re("spare", 1, 2).search(spare.log()), spare.log()


def test_late_agent_of_a_finished_job_is_refused(etcd, cluster, tmp_path):
    flags = etcd_flags(etcd.endpoint_arg(), 2, "done-job")
    for a in [cluster.agent(flags, worker("record.py"), tmp_path / "log",
                            addr=f"127.0.0.{i + 1}") for i in range(2)]:
        assert a.wait(60) == 0, a.log()
    late = cluster.agent(flags, worker("record.py"), tmp_path / "late", addr="127.0.0.3")
    assert late.wait(30) == 1, late.log()
    assert "job 'done-job' has already finished: its rendezvous is closed" in late.log()
    assert not (tmp_path / "late").exists()


def test_two_jobs_on_one_etcd_do_not_meet(etcd, cluster, tmp_path):
    agents = []
    for job, net in (("jobA", 1), ("jobB", 2)):
        for i in range(2):
            agents.append(cluster.agent(etcd_flags(etcd.endpoint_arg(), 2, job),
                                        worker("record.py"), tmp_path / f"{job}.jsonl",
                                        addr=f"127.0.{net}.{i + 1}"))
    for a in agents:
        assert a.wait(60) == 0, a.log()
    for job, net in (("jobA", 1), ("jobB", 2)):
        recs = records(tmp_path / f"{job}.jsonl")
        assert sorted(r["RANK"] for r in recs) == ["0", "1"]
        assert {r["TORCHELASTIC_RUN_ID"] for r in recs} == {job}
        assert {r["MASTER_ADDR"] for r in recs} == {f"127.0.{net}.1"}
    keys = etcd.keys()
    assert any(k.startswith("/ddprun/jobA/") for k in keys), sorted(keys)
    assert any(k.startswith("/ddprun/jobB/") for k in keys), sorted(keys)
    assert all(k.startswith(("/ddprun/jobA/", "/ddprun/jobB/")) for k in keys), sorted(keys)


@pytest.mark.parametrize("backend", ["etcd-v2", "etcd-v3"])
def test_etcd_v2_and_v3_are_aliases(etcd, cluster, tmp_path, backend):
    job = backend.replace("-", "_")
    flags = etcd_flags(etcd.endpoint_arg(), 2, job, backend=backend)
    agents = [cluster.agent(flags, worker("record.py"), tmp_path / "log",
                            addr=f"127.0.0.{i + 1}") for i in range(2)]
    for a in agents:
        assert a.wait(60) == 0, a.log()
        assert formed_re(job, r"\d", 2).search(a.log()), a.log()
        if backend == "etcd-v2":  # one line saying that ddprun speaks etcd's v3 API
            notices = [line for line in a.log().splitlines() if "v3 API" in line]
            assert len(notices) == 1, a.log()
    assert len(records(tmp_path / "log")) == 2
    assert any(k.startswith(f"/ddprun/{job}/") for k in etcd.keys())


def test_unreachable_endpoints_fail_within_read_timeout(cluster, tmp_path):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    conf = "read_timeout=2,join_timeout=60"
    t0 = time.monotonic()
    a = cluster.agent(etcd_flags(",".join(dead), 2, "nowhere", conf=conf), worker("record.py"),
                      tmp_path / "log", addr="127.0.0.2")
    assert a.wait(30) == 1, a.log()
    took = time.monotonic() - t0
    assert took < 12, f"gave up after {took:.1f} s with read_timeout=2"
    lines = [line for line in a.log().splitlines() if all(ep in line for ep in dead)]
    assert lines, a.log()
    assert not (tmp_path / "log").exists()


def test_endpoint_without_port_means_2379(cluster, tmp_path):
    host = "127.0.0.77"
    with socket.socket() as s:
        if s.connect_ex((host, 2379)) == 0:
            raise AssertionError(f"something listens on {host}:2379; this test needs it free")
    a = cluster.agent(etcd_flags(host, 2, "default-port", conf="read_timeout=2"),
                      worker("record.py"), tmp_path / "log", addr="127.0.0.2")
    assert a.wait(30) == 1, a.log()
    assert re.search(rf"{re.escape(host)}:2379\b", a.log()), a.log()


def test_in_process_recovery_across_nodes_goes_through_etcd(etcd, cluster):
    # --in-process-recovery over etcd: rank 1's node replaces it alone, the other node learns of
    # the recovery through etcd (its generation watcher) and its worker rebuilds the process
    # group in the process it started in; one round, one restart spent.
    tool = SDK_BIN_DIR / "recovery_tool"
    assert tool.exists(), f"{tool} not built"
    flags = etcd_flags(etcd.endpoint_arg(), 2, "inproc", max_restarts=2)
    agents = [cluster.agent([*flags, "--in-process-recovery", "--no-python"], tool, "--steps",
                            "30", "--step-ms", "50", "--kill", "1:12", addr=a)
              for a in ("127.0.0.2", "127.0.0.3")]
    for a in agents:
        assert a.wait(120) == 0, a.log()
    out = "\n".join(a.log() for a in agents)
    assert "on worker-replaceable: replace" in agents[1].log(), out
    assert "on peer-recovering: follow" in agents[0].log(), out
    starts = re.findall(r"rank (\d) pid (\d+) generation (\d) start", out)
    ends = re.findall(r"rank (\d) pid (\d+) params (\w+) recoveries 1", out)
    assert len(ends) == 2 and len({e[2] for e in ends}) == 1, out  # the same parameters
    survivor = [e for e in ends if e[0] == "0"][0]
    assert [s[1] for s in starts if s[0] == "0"] == [survivor[1]], out  # rank 0 kept its process
    assert [s[2] for s in starts if s[0] == "1"] == ["0", "1"], out  # rank 1 replaced in gen 1
    for a in agents:
        assert "re-formed" not in a.log() and "restart count 1 of 2" in a.log(), a.log()
    assert all(k.startswith("/ddprun/inproc/") for k in etcd.keys())
