"""Checkpoint helpers of the C++ SDK: a saver SIGKILLed in the middle of a save never leaves a
torn checkpoint, and a two-rank job restores parameters, momentum buffers and progress."""
import random
import re
import signal
import subprocess
import time

import pytest

from sdkutil import sdk_bin


def verify(path):
    r = subprocess.run([sdk_bin("checkpoint_tool"), "verify", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return int(re.search(r"complete (\d+)", r.stdout).group(1))


def test_sigkill_mid_save_leaves_old_or_new_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    rng = random.Random(1234)
    last = 0
    for _ in range(5):
        saver = subprocess.Popen([sdk_bin("checkpoint_tool"), "save-loop", str(path)],
                                 stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            started = time.monotonic()
            line = saver.stdout.readline()  # one complete save, so the next one is under way
            assert line.startswith("saved "), line
            one_save = time.monotonic() - started
            time.sleep(rng.uniform(0, one_save))  # the kill lands at a random point of a save
        finally:
            saver.send_signal(signal.SIGKILL)
            saver.wait(timeout=30)
            saver.stdout.close()
        step = verify(path)
        assert step >= 1
        last = step
    assert last >= 1
    # The next save cleans up the temp files the killed saves left.
    saver = subprocess.Popen([sdk_bin("checkpoint_tool"), "save-loop", str(path)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert saver.stdout.readline().startswith("saved ")
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
        saver.stdout.close()
    assert len(list(tmp_path.glob("ckpt.pt.tmp.*"))) <= 1  # at most the one killed just now


def states(output):
    found = re.findall(r"rank (\d) epoch (\d+) step (\d+) params (\S+) momentum (\S+)", output)
    return {int(rank): tuple(rest) for rank, *rest in found}


def test_round_trip_on_both_ranks(launcher, tmp_path):
    path = tmp_path / "dir" / "ckpt.pt"
    first = launcher.run(2, [sdk_bin("checkpoint_tool"), "train", str(path)], timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    saved = states(first.stdout)[0]
    assert saved[:2] == ("2", "3")
    assert float(saved[3]) != 0.0  # momentum buffers exist
    second = launcher.run(2, [sdk_bin("checkpoint_tool"), "train", str(path)], timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    loaded = states(second.stdout)
    assert loaded == {0: saved, 1: saved}, (saved, loaded)


def test_truncated_checkpoint_is_an_error_naming_the_file(launcher, tmp_path):
    path = tmp_path / "ckpt.pt"
    assert launcher.run(2, [sdk_bin("checkpoint_tool"), "train", str(path)],
                        timeout=120).returncode == 0
    path.write_bytes(path.read_bytes()[:-100])
    r = launcher.run(2, [sdk_bin("checkpoint_tool"), "train", str(path)], timeout=120)
    assert r.returncode != 0
    assert f"checkpoint {path}: truncated, corrupt" in r.stdout + r.stderr
