"""A hung worker on one node of a two-node c10d job: that node finds it and captures its stacks,
and every node restarts from the job-wide budget (the same TORCHELASTIC_RESTART_COUNT
everywhere); the job then finishes on both nodes."""
import re

from hang_helpers import (FAST_CONF, free_port, job_summary, jobs, listening,  # noqa: F401
                          records, stacks_file, wait_until, worker)

# A SIGSTOPped worker only dies of SIGKILL, after the grace period: keep it short.
STOPPED_GRACE = ["--shutdown-timeout", "3"]


def test_hung_worker_on_node_1_restarts_both_nodes(jobs, tmp_path):
    port = free_port()
    log, go = tmp_path / "log", tmp_path / "go"
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hangjob",
             "--rdzv-conf", FAST_CONF, "--hang-timeout", "2", "--max-restarts", "1",
             *STOPPED_GRACE]
    args = [worker("hb_worker.py"), log, "--hang-rank", "1", "--how", "stop", "--wait-for", go]
    # The agent on 127.0.0.1 binds the endpoint and hosts the rendezvous store; start it first.
    node0 = jobs.start([*flags, "--local-addr", "127.0.0.1"], *args, name="node0")
    wait_until(lambda: listening(port) or not node0.running(), "node 0 to host the store")
    assert node0.running(), node0.output()
    node1 = jobs.start([*flags, "--local-addr", "127.0.0.2"], *args, name="node1")

    def attempt_started(attempt):
        return len([r for r in records(log) if r["event"] == "start"
                    and r["attempt"] == attempt]) == 2

    wait_until(lambda: attempt_started(1) or not (node0.running() and node1.running()),
               "both nodes to start attempt 1", timeout=120)
    go.touch()
    assert node0.wait(120) == 0, node0.output()
    assert node1.wait(120) == 0, node1.output()

    recs = records(log)
    starts = sorted((r["attempt"], r["group_rank"], r["rank"]) for r in recs
                    if r["event"] == "start")
    assert starts == [(0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 1)], starts
    done = sorted((r["attempt"], r["group_rank"]) for r in recs if r["event"] == "done")
    assert done == [(1, 0), (1, 1)], done

    err1 = node1.stderr()
    hung_pid = next(r["pid"] for r in recs if r["event"] == "start" and r["attempt"] == 0
                    and r["group_rank"] == 1)
    assert re.search(rf"rank 1 \(local rank 0, pid {hung_pid}\) hung: no heartbeat for [\d.]+ s",
                     err1), err1
    stacks = stacks_file(node1.log_dir, 0, 0)
    assert stacks is not None and stacks.stat().st_size > 0, err1
    for node in (node0, node1):
        err = node.stderr()
        assert "restarting the worker group: attempt 1 (1 of 1 restarts used)" in err, err
        summary = job_summary(err)
        assert (summary["attempts"], summary["restarts"]) == (2, 1), summary
    assert job_summary(node1.stderr())["hangs"] == 1
    assert job_summary(node0.stderr())["hangs"] == 0
    assert not re.search(r"\) hung: ", node0.stderr())
