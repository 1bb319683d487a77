"""In-process recovery (ddprun --in-process-recovery, ddprun::TrainingLoop): a rank SIGKILLed in
the middle of a step is started again alone; the other ranks keep their processes, rebuild the
process group with it and hand it the model and optimizer state; the step that failed runs
again and the job ends with the parameters, bitwise, of a run that never failed. The
replacement is the standby ddprun starts once every worker runs its loop; the next standby
goes with the job. A second failure during the recovery restarts the whole group, as without the flag."""
import os
import re

import pytest

from sdkutil import Launcher, sdk_bin

STEPS = 30
TAG = f"in-process-recovery-{os.getpid()}"  # in every worker's environment


def run(launcher, nproc, args, *, in_process=True, max_restarts=2, load=None, env=None):
    if launcher.name != "ddprun":
        pytest.skip("in-process recovery is ddprun's")
    import subprocess
    cmd = launcher.command(nproc, max_restarts=max_restarts)
    if in_process:
        cmd.insert(1, "--in-process-recovery")
    argv = [sdk_bin("recovery_tool"), "--steps", str(STEPS)] + list(args)
    if load:
        argv += ["--load", str(load)]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", DDPRUN_TEST_TAG=TAG, **(env or {}))
    return subprocess.run(cmd + argv, capture_output=True, text=True, timeout=240, env=full_env)


def leftover_tools():
    """This module's recovery_tool processes still running (other tests, which ctest may run at
    the same time, start the tool too: only processes with this module's tag count)."""
    import subprocess
    found = subprocess.run(["pgrep", "-f", "bin/recovery_tool"], capture_output=True, text=True)
    mine = []
    for pid in found.stdout.split():
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"DDPRUN_TEST_TAG={TAG}".encode() in environ:
            mine.append(pid)
    return mine


def ranks(result):
    """rank -> {"start_pids": [...], "end_pid", "hash", "recoveries"}."""
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    found = {}
    for rank, pid, _ in re.findall(r"rank (\d+) pid (\d+) generation (\d+) start", out):
        found.setdefault(int(rank), {"start_pids": []})["start_pids"].append(int(pid))
    for rank, pid, digest, rec, transport in re.findall(
            r"rank (\d+) pid (\d+) params (\w+) recoveries (\d+) transport (\S+)", out):
        found[int(rank)].update(end_pid=int(pid), hash=digest, recoveries=int(rec),
                                transport=transport)
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """nproc -> (the final parameters' hash, the gradient transport) of a run that never
    failed (every rank agrees)."""
    launcher = Launcher(tmp_path_factory.mktemp("whole") / "logs")
    hashes = {}
    for nproc in (2, 3):
        found = ranks(run(launcher, nproc, []))
        assert len({(r["hash"], r["transport"]) for r in found.values()}) == 1, found
        hashes[nproc] = found[0]["hash"]
        hashes["transport"] = found[0]["transport"]
    return hashes


@pytest.mark.parametrize("nproc,killed", [(2, 1), (3, 1), (3, 0)])
def test_killed_rank_is_replaced_and_the_survivors_keep_their_processes(
        launcher, uninterrupted, nproc, killed):
    result = run(launcher, nproc, ["--kill", f"{killed}:12", "--step-ms", "50"])
    found = ranks(result)
    log = result.stderr
    assert sorted(found) == list(range(nproc)), result.stdout + log
    for rank, r in found.items():
        assert r["hash"] == uninterrupted[nproc], (rank, found, uninterrupted)
        assert r["recoveries"] == 1, found
        # The rebuilt group's transport is the first one's (shared memory made again with the
        # replacement, where the host allows it).
        assert r["transport"] == uninterrupted["transport"], found
        if rank == killed:  # started twice: the first process died, the second finished
            assert len(r["start_pids"]) == 2 and r["end_pid"] == r["start_pids"][1], found
        else:  # one process from start to end
            assert r["start_pids"] == [r["end_pid"]], found
    assert "HEALTHY -> RECOVERING on worker-replaceable: replace" in log, log
    # The replacement is the standby ddprun started once every worker ran its loop (the kill
    # comes 0.6 s after that).
    assert re.search(rf"in-process recovery: rank {killed} \(pid \d+\) replaced by pid \d+ "
                     r"\(the standby\)", log), log
    assert "RECOVERING -> HEALTHY on recovered: resume" in log, log
    assert "attempt 1: started" not in log, log  # no group restart
    assert "restart count 1 of 2" in log, log
    assert not leftover_tools(), leftover_tools()  # the new standby went with the job


def test_over_gloo_tcp_a_survivor_waiting_on_a_live_peer_is_freed(launcher):
    # Without the shared-memory transport the gradients go round Gloo's ring: rank 2 reads from
    # the dead rank 1 and fails, rank 0 reads from rank 2 and would wait out the group's
    # timeout; ddprun's notice frees it (each wait looks for it every 50 ms).
    tcp = {"DDPRUN_SHM": "0"}
    whole = ranks(run(launcher, 3, [], env=tcp))
    result = run(launcher, 3, ["--kill", "1:12"], env=tcp)
    found = ranks(result)
    assert {r["transport"] for r in found.values()} == {"gloo"}, found
    assert len({r["hash"] for r in whole.values()}) == 1, whole
    for rank, r in found.items():
        assert r["hash"] == whole[0]["hash"] and r["recoveries"] == 1, (rank, found, whole)
    assert found[0]["start_pids"] == [found[0]["end_pid"]], found
    assert found[2]["start_pids"] == [found[2]["end_pid"]], found


def test_second_failure_during_the_recovery_restarts_the_group(launcher, uninterrupted):
    # The replacement dies before it joins: the group restarts as a whole (attempt 1), which
    # trains from the start (no checkpoint) to the same parameters.
    result = run(launcher, 2, ["--kill", "1:12", "--kill-replacement", "1"])
    found = ranks(result)
    log = result.stderr
    assert "HEALTHY -> RECOVERING" in log, log
    assert re.search(r"-> INIT on worker-failed: restart", log), log
    assert "attempt 2: started 2 worker(s)" in log, log  # the recovery spent restart 1
    for r in found.values():
        assert r["hash"] == uninterrupted[2], found


def test_without_the_flag_the_loop_runs_and_the_group_restarts(launcher, uninterrupted):
    result = run(launcher, 2, ["--kill", "1:12"], in_process=False)
    found = ranks(result)
    log = result.stderr
    assert "RECOVERING" not in log and "attempt 1: started 2 worker(s)" in log, log
    for r in found.values():
        assert r["hash"] == uninterrupted[2] and r["recoveries"] == 0, found


def test_a_zero_optimizer_is_refused_by_name(launcher):
    # Its shards die with their rank: a replacement could not be given its state.
    result = run(launcher, 2, ["--zero", "1"], max_restarts=0)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "cannot hand a replacement its ZeroRedundancyOptimizer shard" in result.stderr, (
        result.stderr)


def test_workers_outside_a_training_loop_restart_the_group(launcher, uninterrupted):
    # Workers with a loop of their own never announce one: ddprun says so and restarts the
    # group, which trains from the start to the same parameters.
    result = run(launcher, 2, ["--kill", "1:12", "--plain", "1"])
    found = ranks(result)
    log = result.stderr
    assert "in-process recovery: not every other worker runs a ddprun::TrainingLoop" in log, log
    assert "attempt 1: started 2 worker(s)" in log, log
    for r in found.values():
        assert r["hash"] == uninterrupted[2], found
