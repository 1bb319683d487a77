"""The `train` example end to end under the launcher: the same parameters whatever the world
size, and a run whose worker is SIGKILLed resumes from its checkpoint to the same result."""
import re
import subprocess

import pytest

from sdkutil import checksum_of, sdk_bin

ARGS = ["--steps", "60", "--global-batch", "64", "--seed", "3"]


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    from sdkutil import Launcher
    result = Launcher(tmp_path_factory.mktemp("w2") / "logs").run(2, [sdk_bin("train"), *ARGS])
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_world_sizes_agree(world2, launcher):
    one = launcher.run(1, [sdk_bin("train"), *ARGS])
    assert one.returncode == 0, one.stdout + one.stderr
    c1, c2 = checksum_of(one.stdout), checksum_of(world2)
    assert abs(c1 - c2) <= 1e-4 * abs(c1), (c1, c2)
    assert "world 2" in world2 and "world 1" in one.stdout
    assert "step 60/60 loss" in world2
    # The loss went down: the job really trained.
    losses = [float(line.rsplit(" ", 1)[1]) for line in world2.splitlines() if " loss " in line]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_sigkilled_worker_resumes_from_checkpoint(world2, launcher, tmp_path):
    ckpt = tmp_path / "ckpt"
    result = launcher.run(2, [sdk_bin("train"), *ARGS, "--checkpoint", str(ckpt),
                              "--checkpoint-every", "20", "--memory-every", "0",
                              "--kill-rank-at-step", "1:30"],
                          max_restarts=1)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "SIGKILL at step 30" in out
    assert "checkpoint at step 20" in out
    assert "resuming at step 20 from the checkpoint file" in out
    assert checksum_of(result.stdout) == pytest.approx(checksum_of(world2), rel=1e-4)
    assert (ckpt / "checkpoint.pt").is_file()
    assert not list(ckpt.glob("*.tmp.*")), "a temp checkpoint was left behind"


def test_under_ddprun_a_restart_resumes_from_memory(world2, launcher, tmp_path):
    if launcher.name != "ddprun":
        pytest.skip("in-memory checkpoints come from ddprun")
    ckpt = tmp_path / "ckpt"
    result = launcher.run(2, [sdk_bin("train"), *ARGS, "--checkpoint", str(ckpt),
                              "--checkpoint-every", "20", "--kill-rank-at-step", "1:30"],
                          max_restarts=1)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "SIGKILL at step 30" in out
    # Rank 0 saved to memory after step 29, unless it was still writing when it was stopped.
    assert re.search(r"resuming at step (29|30) from memory", out), out
    assert checksum_of(result.stdout) == pytest.approx(checksum_of(world2), rel=1e-4)


def test_bad_command_line_exits_2():
    for argv in (["--steps", "ten", "--global-batch", "8"], ["--global-batch", "8"],
                 ["--steps", "5", "--global-batch", "8", "--backend", "mpi"],
                 ["--steps", "5", "--global-batch", "8", "--frobnicate", "1"]):
        r = subprocess.run([sdk_bin("train"), *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (argv, r.stderr)
        assert r.stderr.startswith("train: "), r.stderr
        assert "usage: train" in r.stderr
