"""C++ workers on the SDK are watched for hangs with no code of their own: the SDK beats after
every collective and every synchronised backward, so `ddprun --hang-timeout` finds a rank that
stopped, captures its stacks, restarts the group, and the job finishes."""
import os
import re
import subprocess

import pytest

from sdkutil import LAUNCHER, sdk_bin


def test_hung_cpp_rank_is_found_and_the_job_restarts(launcher):
    if LAUNCHER != "ddprun":
        pytest.skip("hang detection is ddprun's (DDPRUN_SDK_TEST_LAUNCHER=torchrun has none)")
    cmd = launcher.command(2, max_restarts=1) + ["--hang-timeout", "3"]
    # 20 steps of 250 ms: each attempt outlasts the hang timeout, so beats must keep coming.
    cmd += [sdk_bin("sdk_hang"), "--steps", "20", "--step-ms", "250", "--hang-rank", "1",
            "--hang-step", "5"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "[sdk_hang] rank 1: stuck before backward at step 5" in out
    hung = re.findall(r"rank (\d) \(local rank \d, pid \d+\) hung: no heartbeat for [\d.]+ s", out)
    # Rank 1 stopped; rank 0 then waits in backward's all-reduce and goes silent at the same
    # moment (a DDP peer cannot beat while its collective waits), so either may be reported
    # first. The report is a no-heartbeat hang, which needs beats from the SDK in the first place.
    assert hung and set(hung) <= {"0", "1"}, out
    for rank in hung:
        stacks = list(launcher.log_dir.glob(f"*/attempt_0/{rank}/stacks.txt"))
        assert len(stacks) == 1 and stacks[0].stat().st_size > 0, out
        if rank == "1":  # native stacks: the rank sleeps in main, outside any collective
            text = stacks[0].read_text(errors="replace")
            assert "sleep" in text and "main" in text, text
    assert "restarting the worker group: attempt 1 (1 of 1 restarts used)" in out
    assert re.search(r"sdk_hang done attempt=1 steps=20 checksum=\S+", out), out
    assert "sdk_hang done attempt=0" not in out
    assert re.search(r"job summary: 2 attempts, 1 restart, 0 re-formations, [12] hangs?", out), out
