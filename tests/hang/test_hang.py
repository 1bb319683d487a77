"""Hung workers on one node: found by heartbeats (--hang-timeout, --hang-start-timeout) or by
torch's FileTimer, their stacks captured to attempt_N/L/stacks.txt, the group restarted like
after a failure, exit 124 when no restart is left; workers that finished but do not exit
(--exit-timeout) are stopped and the job succeeds; no false positives."""
import json
import re

import pytest

from hang_helpers import (TORCH1_PYTHON, TORCH2_PYTHON, all_dead, clean_env, events, job_summary,
                          jobs, pid_alive, records, stacks_file, torch2_path_env, wait_for,
                          worker)  # noqa: F401 (jobs is a fixture)

STANDALONE = ["--standalone", "--nproc-per-node", "2"]
HB = worker("hb_worker.py")
# A SIGSTOPped worker does not act on SIGTERM until continued: only SIGKILL, after the grace
# period, ends it. A short grace keeps the tests that stop a worker fast.
STOPPED_GRACE = ["--shutdown-timeout", "3"]


def hung_line(rank, local_rank, what):
    return re.compile(rf"rank {rank} \(local rank {local_rank}, pid (\d+)\) hung: {what}: "
                      r"capturing its stacks")


def start_of(recs, rank, attempt):
    found = [r for r in recs if r["event"] == "start" and r["rank"] == rank
             and r["attempt"] == attempt]
    assert len(found) == 1, recs
    return found[0]


def go_when_attempt_starts(job, log, go, attempt, nproc=2):
    """Lets the workers of `attempt` finish: creates `go` once they all started."""
    started = lambda: len([r for r in records(log) if r["event"] == "start"  # noqa: E731
                           and r["attempt"] == attempt]) == nproc
    wait_for(lambda: started() or not job.running(), timeout=60)
    assert started(), f"the workers of attempt {attempt} did not start:\n{job.output()}"
    go.touch()


def test_stopped_worker_is_found_hung_and_the_group_restarts(jobs, tmp_path):
    log, go, ev = tmp_path / "log", tmp_path / "go", tmp_path / "events.jsonl"
    job = jobs.start([*STANDALONE, "--hang-timeout", "1.5", "--max-restarts", "1",
                      "--event-log", ev, *STOPPED_GRACE],
                     HB, log, "--hang-rank", "1", "--how", "stop", "--wait-for", go)
    go_when_attempt_starts(job, log, go, 1)
    assert job.wait(120) == 0, job.output()
    err = job.stderr()
    recs = records(log)

    m = hung_line(1, 1, r"no heartbeat for [\d.]+ s").search(err)
    assert m, err
    assert int(m.group(1)) == start_of(recs, 1, 0)["pid"]
    stacks = stacks_file(job.log_dir, 0, 1)
    assert stacks is not None, f"no attempt_0/1/stacks.txt under {job.log_dir}\n{err}"
    assert stacks.stat().st_size > 0
    assert re.search(rf"  stacks: {re.escape(str(stacks))} \([\d.]+ s\)", err), err
    assert "restarting the worker group: attempt 1 (1 of 1 restarts used)" in err
    assert sorted((r["attempt"], r["rank"]) for r in recs if r["event"] == "done") == \
        [(1, 0), (1, 1)]
    assert job_summary(err) | {"wall_s": 0} == {"attempts": 2, "restarts": 1, "reformations": 0,
                                                "hangs": 1, "wall_s": 0}
    assert "FAILED" not in err
    # No process left: every worker ddprun started (the SIGSTOPped one included) is gone.
    pids = [e["pid"] for e in events(ev, "worker_start")]
    assert len(pids) == 4 and {r["pid"] for r in recs if r["event"] == "start"} == set(pids)
    assert all_dead(pids, timeout=2), [p for p in pids if pid_alive(p)]


def test_torch_gloo_rank_stuck_outside_the_collective(jobs, tmp_path, torch2_python):
    out = tmp_path / "result.json"
    job = jobs.start([*STANDALONE, "--hang-timeout", "3", "--max-restarts", "1"],
                     worker("gloo_hang.py"), "--out", out, env=torch2_path_env())
    assert job.wait(240) == 0, job.output()
    err = job.stderr()
    assert hung_line(1, 1, r"no heartbeat for [\d.]+ s").search(err), err
    # Rank 0 waited in all_reduce, beating: only the stuck rank is hung.
    assert not re.search(r"rank 0 \(local rank 0, pid \d+\) hung", err), err
    stacks = stacks_file(job.log_dir, 0, 1)
    assert stacks is not None, err
    text = stacks.read_text(errors="replace")
    assert "stuck_outside_the_collective" in text, text  # py-spy's Python stack
    assert "restarting the worker group: attempt 1 (1 of 1 restarts used)" in err
    result = json.loads(out.read_text())
    assert result["attempt"] == 1 and result["world"] == 2 and result["torch"].startswith("2.")
    assert job_summary(err)["hangs"] == 1


@pytest.mark.parametrize("python", ["torch1", "torch2"])
def test_file_timer_scope_expiry_is_a_hang(jobs, tmp_path, python):
    python = TORCH1_PYTHON if python == "torch1" else TORCH2_PYTHON
    ev = tmp_path / "events.jsonl"
    job = jobs.start([*STANDALONE, "--max-restarts", "1", "--event-log", ev],
                     worker("timer_worker.py"), tmp_path,
                     env=clean_env(python=python, TORCHELASTIC_ENABLE_FILE_TIMER=1))
    assert job.wait(240) == 0, job.output()
    err = job.stderr()
    starts = records(tmp_path / "starts.jsonl")
    assert all(s["timer_file"] for s in starts), starts
    m = hung_line(1, 1, r"timer scope 'stuck_batch' expired[^:\n]*").search(err)
    assert m, err
    stuck = [s for s in starts if s["rank"] == 1 and s["attempt"] == 0]
    assert len(stuck) == 1 and int(m.group(1)) == stuck[0]["pid"]
    hangs = events(ev, "hang")
    assert [(h["rank"], h["kind"], h["pid"]) for h in hangs] == \
        [(1, "timer_expired", stuck[0]["pid"])]
    assert "stuck_batch" in hangs[0]["reason"]
    # The scope's signal (the client's default, SIGKILL) ended the worker.
    exits = [e for e in events(ev, "worker_exit") if e["pid"] == stuck[0]["pid"]]
    assert len(exits) == 1 and exits[0].get("signal") == "SIGKILL", exits
    assert stacks_file(job.log_dir, 0, 1) is not None
    assert "restarting the worker group: attempt 1 (1 of 1 restarts used)" in err
    assert not (tmp_path / "result_0.json").exists()
    assert json.loads((tmp_path / "result_1.json").read_text())["attempt"] == 1


def test_no_restart_left_exits_124_with_hung_and_stacks_in_the_summary(jobs, tmp_path):
    log = tmp_path / "log"
    job = jobs.start([*STANDALONE, "--hang-timeout", "1", "--max-restarts", "0",
                      *STOPPED_GRACE],
                     HB, log, "--hang-rank", "1", "--how", "stop", "--wait-for", tmp_path / "never")
    assert job.wait(60) == 124, job.output()
    err = job.stderr()
    assert "=" * 20 in err, err
    summary = err[err.index("=" * 20):]
    assert "Root Cause (first observed failure)" in summary
    assert "  rank      : 1 (local_rank: 1)" in summary
    assert re.search(r"  hung      : no heartbeat for [\d.]+ s", summary), summary
    m = re.search(r"  stacks    : (\S+)", summary)
    assert m, summary
    stacks = stacks_file(job.log_dir, 0, 1)
    assert stacks is not None and m.group(1) == str(stacks)
    assert stacks.stat().st_size > 0
    assert re.search(r"job summary: 1 attempt, 0 restarts, 0 re-formations, 1 hang, "
                     r"wall time [\d.]+ s", err), err
    pids = [r["pid"] for r in records(log) if r["event"] == "start"]
    assert len(pids) == 2 and all_dead(pids, timeout=2)


def test_worker_that_does_not_exit_after_another_exited_0_is_stopped(jobs, tmp_path):
    log, ev = tmp_path / "log", tmp_path / "events.jsonl"
    job = jobs.start([*STANDALONE, "--exit-timeout", "2", "--event-log", ev],
                     HB, log, "--linger-rank", "1", "--linger", "600")
    assert job.wait(60) == 0, job.output()
    assert job.elapsed < 30, job.elapsed
    err = job.stderr()
    lingering = [r for r in records(log) if r["event"] == "lingering"]
    assert len(lingering) == 1 and lingering[0]["rank"] == 1
    pid = lingering[0]["pid"]
    assert re.search(rf"rank 1 \(local rank 1, pid {pid}\) has not exited", err), err
    stacks = stacks_file(job.log_dir, 0, 1)
    assert stacks is not None, err
    assert f"  stacks: {stacks} (" in err
    assert all_dead([pid], timeout=2)
    assert [(e["rank"], e["pid"]) for e in events(ev, "exit_hang")] == [(1, pid)]
    assert "restarting" not in err and "FAILED" not in err
    assert job_summary(err)["attempts"] == 1


def test_silence_after_another_worker_exited_0_is_left_to_the_exit_timeout(jobs, tmp_path):
    """Rank 1 beats, then "finishes" and goes silent after rank 0 exited 0: not a hang (no
    restart, exit 0); --exit-timeout stops it."""
    log = tmp_path / "log"
    job = jobs.start([*STANDALONE, "--hang-timeout", "2", "--exit-timeout", "4",
                      "--max-restarts", "1"],
                     HB, log, "--linger-rank", "1", "--linger", "600")
    assert job.wait(60) == 0, job.output()
    err = job.stderr()
    assert re.search(r"rank 1 \(local rank 1, pid \d+\): no heartbeat for [\d.]+ s after another "
                     r"worker exited 0: left to --exit-timeout", err), err
    assert re.search(r"rank 1 \(local rank 1, pid \d+\) has not exited", err), err
    assert not re.search(r"\) hung: ", err), err
    assert {r["attempt"] for r in records(log)} == {0}
    assert job_summary(err)["hangs"] == 0


def test_no_first_heartbeat_within_the_start_timeout(jobs, tmp_path):
    log, ev = tmp_path / "log", tmp_path / "events.jsonl"
    job = jobs.start([*STANDALONE, "--hang-start-timeout", "2", "--max-restarts", "0",
                      "--event-log", ev],
                     HB, log, "--silent-rank", "1", "--wait-for", tmp_path / "never")
    assert job.wait(60) == 124, job.output()
    err = job.stderr()
    assert hung_line(1, 1, r"no first heartbeat within [\d.]+ s of start").search(err), err
    hangs = events(ev, "hang")
    assert [(h["rank"], h["local_rank"], h["kind"]) for h in hangs] == \
        [(1, 1, "no_first_heartbeat")], hangs
    assert hangs[0]["pid"] == start_of(records(log), 1, 0)["pid"]


@pytest.mark.parametrize("flags", [[], ["--hang-timeout", "1"]], ids=["no-timeout", "timeout"])
def test_workers_that_never_beat_are_not_hung(jobs, tmp_path, flags):
    """Without --hang-timeout nothing is judged; with it, only workers that have beaten are."""
    log = tmp_path / "log"
    job = jobs.start([*STANDALONE, *flags], HB, log, "--no-beat", "--run-for", "3")
    assert job.wait(60) == 0, job.output()
    err = job.stderr()
    assert "hung" not in err, err
    assert job_summary(err) | {"wall_s": 0} == {"attempts": 1, "restarts": 0, "reformations": 0,
                                                "hangs": 0, "wall_s": 0}
    starts = [r for r in records(log) if r["event"] == "start"]
    assert len(starts) == 2 and all(s["hb_socket"] for s in starts), starts


def test_steady_heartbeats_are_not_a_hang(jobs, tmp_path):
    log = tmp_path / "log"
    job = jobs.start([*STANDALONE, "--hang-timeout", "1"], HB, log,
                     "--interval", "0.1", "--run-for", "4")
    assert job.wait(60) == 0, job.output()
    err = job.stderr()
    assert "hung" not in err, err
    assert job_summary(err)["hangs"] == 0 and job_summary(err)["attempts"] == 1
    assert len([r for r in records(log) if r["event"] == "done"]) == 2
