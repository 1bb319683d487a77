"""A collective hang explained: real torch gloo workers, rank 1 skips an all_reduce that rank 0
waits in, on one node and on two. Before the group is stopped the agent asks every worker for its
flight recorder (torch 2.x; warm workers answer, see worker-sdk/python/ddprun/flight_recorder.py)
and reads the stacks it captured, and one line names the collective, who waits in it and who
never entered it: on the console, in the failure summary, in the event log and in /status.
Without a flight recorder (torch 1.13, or cold workers) the stacks alone place each rank."""
import json
import re

import pytest

from hang_helpers import (FAST_CONF, SOURCE_DIR, TORCH1_PYTHON, clean_env, events,  # noqa: F401
                          free_port, health_port, http_get, jobs, listening, torch2_path_env,
                          wait_until, worker)

STANDALONE = ["--standalone", "--nproc-per-node", "2"]
SKIP = worker("skip_collective.py")
LINE = re.compile(r"collective hang: (.*)")


def verdict(err):
    m = LINE.search(err)
    assert m, err
    return m.group(1)


def finished_on_attempt_1(job, out):
    assert job.wait(240) == 0, job.output()
    assert json.loads(out.read_text())["attempt"] == 1


@pytest.mark.parametrize("nproc", [2, 4])
def test_flight_recorder_names_the_rank_that_skipped_the_collective(jobs, tmp_path, nproc):
    out, ev = tmp_path / "result.json", tmp_path / "events.jsonl"
    job = jobs.start(["--standalone", "--nproc-per-node", str(nproc), "--hang-timeout", "3",
                      "--max-restarts", "1", "--warm-start", "on", "--event-log", ev,
                      "--health-port", "0"],
                     SKIP, "--out", out, "--skip-rank", "1", "--steps", "60",  # /status stays up
                     env=torch2_path_env())
    port = health_port(job)
    wait_until(lambda: "collective hang:" in job.stderr(), "the collective judgement", 120)
    status = json.loads(http_get(port, "/status")[1])
    finished_on_attempt_1(job, out)
    err = job.stderr()
    line = verdict(err)
    waiting = "rank 0" if nproc == 2 else "ranks 0,2-3"
    assert re.fullmatch(
        rf"collective #5 all_reduce \(4\.0 kB, pg 0\): {waiting} waiting [\d.]+ s; "
        r"rank 1 \([^,]+, pid \d+\) never entered it \(its last: #4 all_reduce\)", line), line
    assert re.search(rf"flight recorders: {nproc} of {nproc} workers answered", err), err
    judged = events(ev, "collective_hang")
    assert len(judged) == 1, judged
    assert judged[0]["culprits"] == [1] and judged[0]["seq"] == 5
    assert judged[0]["op"] == "all_reduce" and judged[0]["source"] == "flight_recorder"
    assert judged[0]["summary"] == line
    assert status["hang_diagnosis"] == line
    # torch's own dump directory is the attempt's, and the answers are there.
    fr = job.log_dir.glob("*/attempt_0/flight_recorder/rank_1.json")
    assert json.loads(next(fr).read_text())["pg_status"]["0"]["last_enqueued_collective"] == "4"


def test_without_a_flight_recorder_the_stacks_place_the_ranks(jobs, tmp_path):
    """Cold workers of a plain script have no responder: py-spy's Python stacks say rank 0 is
    inside all_reduce and rank 1 is not in a collective."""
    out = tmp_path / "result.json"
    job = jobs.start([*STANDALONE, "--hang-timeout", "3", "--max-restarts", "1",
                      "--warm-start", "off"],
                     SKIP, "--out", out, env=torch2_path_env())
    finished_on_attempt_1(job, out)
    err = job.stderr()
    line = verdict(err)
    assert re.fullmatch(
        r"rank 0 waits in a collective \(all_reduce\) \(no flight recorder of it\); "
        r"rank 1 \([^,]+, pid \d+\) is not in one \(its stack: "
        r"sleep_instead_of_the_collective \(skip_collective\.py:\d+\)\)", line), line
    assert "flight recorders: 0 of 2 workers answered" in err


def test_a_cold_worker_that_beats_with_the_python_module_answers(jobs, tmp_path):
    """ddprun.heartbeat() starts the responder: cold workers then answer too."""
    out = tmp_path / "result.json"
    job = jobs.start([*STANDALONE, "--hang-timeout", "3", "--max-restarts", "1",
                      "--warm-start", "off"],
                     SKIP, "--out", out, "--ddprun-module",
                     env=torch2_path_env(PYTHONPATH=SOURCE_DIR / "worker-sdk" / "python"))
    finished_on_attempt_1(job, out)
    err = job.stderr()
    assert "flight recorders: 2 of 2 workers answered" in err, err
    assert re.fullmatch(r"collective #5 all_reduce \(4\.0 kB, pg 0\): rank 0 waiting [\d.]+ s; "
                        r"rank 1 \([^,]+, pid \d+\) never entered it \(its last: #4 all_reduce\)",
                        verdict(err))


def test_a_collective_timeout_is_explained_before_the_others_stop(jobs, tmp_path):
    """No hang detection: rank 0's all_reduce times out in gloo (5 s) and rank 0 fails with
    "Timed out waiting" on its stderr; before rank 1 is stopped, its flight recorder shows it
    never entered the collective."""
    ev = tmp_path / "events.jsonl"
    job = jobs.start([*STANDALONE, "--max-restarts", "0", "--warm-start", "on", "--tee", "2",
                      "--event-log", ev],
                     SKIP, "--out", tmp_path / "result.json", "--gloo-timeout", "5",
                     env=torch2_path_env())
    assert job.wait(240) == 1, job.output()
    err = job.stderr()
    assert re.search(r"rank 0 \(local rank 0, pid \d+\) failed in a collective's timeout "
                     r"\(Timed out waiting 5000ms", err), err
    assert "flight recorders: 1 of 2 workers answered" in err, err
    line = verdict(err)
    assert re.fullmatch(r"rank 0 waits in a collective \(no flight recorder of it\); rank 1 "
                        r"\([^,]+, pid \d+\) is not in one \(its flight recorder's last: "
                        r"#4 all_reduce\)", line), line
    assert events(ev, "collective_hang")[0]["culprits"] == [1]
    assert f"  collective: {line}\n" in err[err.index("Root Cause"):], err  # the summary


def test_torchs_own_dump_of_a_rank_that_timed_out_is_read(jobs, tmp_path):
    """Rank 0 times out in gloo and has torch write its flight recorder (a pickle in the
    attempt's flight-recorder directory, as NCCL's dump on a timeout does) before it exits: the
    agent reads it, so the line names collective #5 and the rank that never entered it."""
    job = jobs.start([*STANDALONE, "--max-restarts", "0", "--warm-start", "on", "--tee", "2"],
                     SKIP, "--out", tmp_path / "result.json", "--gloo-timeout", "5",
                     "--torch-dump-on-timeout", env=torch2_path_env())
    assert job.wait(240) == 1, job.output()
    err = job.stderr()
    assert "flight recorders: 2 of 2 workers answered" in err, err
    assert re.fullmatch(r"collective #5 all_reduce \(4\.0 kB, pg 0\): rank 0 waiting [\d.]+ s; "
                        r"rank 1 \([^,]+, pid \d+\) never entered it \(its last: #4 all_reduce\)",
                        verdict(err))
    assert next(job.log_dir.glob("*/attempt_0/flight_recorder/rank_0")).stat().st_size > 0


def test_torch_1_13_has_no_flight_recorder_and_says_so(jobs, tmp_path):
    """Warm torch 1.13 workers answer that their torch has no flight recorder; the native
    stacks (eu-stack; no py-spy for Debian's Python here) still tell the waiting rank."""
    out = tmp_path / "result.json"
    job = jobs.start([*STANDALONE, "--hang-timeout", "3", "--max-restarts", "1",
                      "--warm-start", "on"],
                     SKIP, "--out", out, env=clean_env(python=TORCH1_PYTHON))
    finished_on_attempt_1(job, out)
    err = job.stderr()
    assert "flight recorders: 0 of 2 workers answered (rank 0: this torch has no flight " \
           "recorder)" in err, err
    line = verdict(err)
    assert line.startswith("rank 0 waits in a collective (no flight recorder of it); "
                           "rank 1 ("), line


@pytest.mark.parametrize("skipper_beats", [False, True])
def test_two_nodes_name_the_same_culprit(jobs, tmp_path, skipper_beats):
    """Rank 1 (node 1) skips the collective rank 0 (node 0) waits in. The nodes exchange their
    evidence through the rendezvous store before stopping, and both print the same line. When
    the skipping rank keeps beating, only node 0 finds a hang: node 1 adds its evidence when
    node 0's report ends the round."""
    port = free_port()
    out = tmp_path / "result.json"
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "collective",
             "--rdzv-conf", FAST_CONF, "--hang-timeout", "3", "--max-restarts", "1",
             "--warm-start", "on"]
    args = ["--out", out] + (["--skipper-beats"] if skipper_beats else [])
    node0 = jobs.start([*flags, "--local-addr", "127.0.0.1"], SKIP, *args,
                       env=torch2_path_env(), name="node0")
    wait_until(lambda: listening(port) or not node0.running(), "node 0 to host the store")
    node1 = jobs.start([*flags, "--local-addr", "127.0.0.2"], SKIP, *args,
                       env=torch2_path_env(), name="node1")
    assert node0.wait(240) == 0, node0.output()
    assert node1.wait(240) == 0, node1.output()
    assert json.loads(out.read_text())["attempt"] == 1
    lines = [verdict(node.stderr()) for node in (node0, node1)]
    assert lines[0] == lines[1], lines
    assert re.fullmatch(
        r"collective #5 all_reduce \(4\.0 kB, pg 0\): rank 0 waiting [\d.]+ s; "
        r"rank 1 \([^,]+, pid \d+\) never entered it \(its last: #4 all_reduce\)", lines[0]), lines
    if skipper_beats:
        assert " hung: " not in node1.stderr(), node1.stderr()
        assert "node 0 (127.0.0.1) reported a hung worker" in node1.stderr(), node1.stderr()
