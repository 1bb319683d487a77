"""Faults and bad input around the c10d rendezvous: an unreachable endpoint, too few nodes, two
jobs on one store, a finished job's late agent, a signal while waiting for peers, and losing
the store while workers run. Each ends with a clear message and never hangs."""
import re
import signal

from mn_helpers import (all_dead, c10d_flags, free_port, records, store_has,
                        wait_until, worker)


def test_unreachable_endpoint_fails_after_join_timeout(cluster, tmp_path):
    port = free_port()
    flags = ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
             "--rdzv_conf=is_host=0,join_timeout=1"]
    a = cluster.agent(flags, worker("record.py"), tmp_path / "log")
    assert a.wait(60) == 1, a.log()
    assert re.search(rf"error: cannot reach the rendezvous store at 127\.0\.0\.1:{port} within "
                     r"1 s \(join_timeout\)", a.log()), a.log()
    # The default job id draws a warning: two jobs with id 'none' would join each other.
    assert "warning: --rdzv-id is 'none'" in a.log()


def test_too_few_nodes_time_out_with_a_count(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    a = cluster.agent(c10d_flags(f"127.0.0.1:{port}", "2:3", "few",
                                 conf="join_timeout=1,last_call_timeout=0"),
                      worker("record.py"), tmp_path / "log", addr="127.0.0.2")
    assert a.wait(60) == 1, a.log()
    assert ("timed out after 1 s (join_timeout) waiting for 2 node(s) of job 'few': only 1 "
            "joined round 0") in a.log()


def test_two_jobs_on_one_store_do_not_interfere(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    agents = []
    for job in ("jobA", "jobB"):
        for i in range(2):
            agents.append(cluster.agent(c10d_flags(f"127.0.0.1:{port}", 2, job, nproc=2),
                                        worker("record.py"), tmp_path / f"{job}.jsonl",
                                        addr=f"127.0.{1 if job == 'jobA' else 2}.{i + 1}"))
    for a in agents:
        assert a.wait(120) == 0, a.log()
    for job in ("jobA", "jobB"):
        recs = records(tmp_path / f"{job}.jsonl")
        assert sorted(int(r["RANK"]) for r in recs) == [0, 1, 2, 3]
        assert {r["TORCHELASTIC_RUN_ID"] for r in recs} == {job}
        assert {r["WORLD_SIZE"] for r in recs} == {"4"}
        assert {r["GROUP_WORLD_SIZE"] for r in recs} == {"2"}
        prefix = "127.0.1." if job == "jobA" else "127.0.2."
        assert all(r["MASTER_ADDR"].startswith(prefix) for r in recs)


def test_late_agent_of_a_finished_job_exits_with_a_message(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    flags = c10d_flags(f"127.0.0.1:{port}", 2, "done-job")
    first = [cluster.agent(flags, worker("record.py"), tmp_path / "log", addr=f"127.0.0.{i + 1}")
             for i in range(2)]
    for a in first:
        assert a.wait(120) == 0, a.log()
    late = cluster.agent(flags, worker("record.py"), tmp_path / "late", addr="127.0.0.3")
    assert late.wait(60) == 1, late.log()
    assert "job 'done-job' has already finished: its rendezvous is closed" in late.log()
    assert not (tmp_path / "late").exists()


def test_sigterm_while_waiting_for_peers(cluster, tmp_path, ddpstore):
    _, port = cluster.ddpstore(ddpstore)
    a = cluster.agent(c10d_flags(f"127.0.0.1:{port}", 2, "lonely"), worker("record.py"),
                      tmp_path / "log", addr="127.0.0.2")
    # It joined and waits for a second node (join_timeout is 60 s).
    wait_until(lambda: store_has(port, "/ddprun/lonely/r/0/node/0"), "the agent to join")
    a.kill(signal.SIGTERM)
    assert a.wait(30) == 128 + signal.SIGTERM, a.log()


def test_losing_the_store_stops_workers_and_exits(cluster, tmp_path, ddpstore):
    store, port = cluster.ddpstore(ddpstore)
    log = tmp_path / "log"
    agents = [cluster.agent(c10d_flags(f"127.0.0.1:{port}", 2, "fragile"), worker("record.py"),
                            log, "--wait-for", tmp_path / "never", addr=f"127.0.0.{i + 1}")
              for i in range(2)]
    recs = wait_until(lambda: len(records(log)) == 2 and records(log), "both workers to start")
    store.kill(signal.SIGKILL)
    for a in agents:
        assert a.wait(60) == 1, a.log()
        assert re.search(rf"error: lost the rendezvous store at 127\.0\.0\.1:{port}: .*; workers "
                         r"stopped, exiting with 1", a.log()), a.log()
    assert all_dead([r["pid"] for r in recs])
