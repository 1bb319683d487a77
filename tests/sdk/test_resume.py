"""A job resumed from a checkpoint trains exactly as one that never stopped, whether the model was
wrapped in DistributedDataParallel before or after the load, with plain SGD or ZeRO/Adam: the
final parameters are bitwise equal on both ranks. Before the fix, a load after wrapping replaced
every parameter's storage, DDP's gradient hooks stopped firing and the ranks drifted apart
without an error. A parameter replaced under DDP with Tensor::set_ is re-attached (same shape)
or refused by name (other shape)."""
import re

import pytest

from sdkutil import sdk_bin


def params(result):
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    found = dict(re.findall(r"rank (\d) params (\w+) sum \S+ rebuilt \d", out))
    assert set(found) == {"0", "1"}, out
    return found


def run(launcher, phase, optim, ckpt, order="wrap-then-load", tamper="none"):
    return launcher.run(2, [sdk_bin("resume_tool"), "--phase", phase, "--optim", optim,
                            "--order", order, "--ckpt", str(ckpt), "--tamper", tamper],
                        timeout=180)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """optim -> the final parameters' hash of 10 uninterrupted steps (both ranks agree)."""
    from sdkutil import Launcher
    launcher = Launcher(tmp_path_factory.mktemp("whole") / "logs")
    hashes = {}
    for optim in ("sgd", "zero-adam"):
        found = params(run(launcher, "whole", optim, tmp_path_factory.mktemp("none") / "c.pt"))
        assert found["0"] == found["1"], found
        hashes[optim] = found["0"]
    return hashes


@pytest.mark.parametrize("optim", ["sgd", "zero-adam"])
@pytest.mark.parametrize("order", ["wrap-then-load", "load-then-wrap"])
def test_resumed_job_equals_the_uninterrupted_one(launcher, tmp_path, uninterrupted, optim, order):
    ckpt = tmp_path / "ckpt.pt"
    first = params(run(launcher, "save", optim, ckpt))
    assert first["0"] == first["1"]
    assert ckpt.is_file()
    resumed = params(run(launcher, "resume", optim, ckpt, order=order))
    assert resumed == {"0": uninterrupted[optim], "1": uninterrupted[optim]}, (
        f"resumed {resumed}, uninterrupted {uninterrupted[optim]}")


def test_parameter_given_new_storage_under_ddp_keeps_being_averaged(launcher, tmp_path,
                                                                     uninterrupted):
    ckpt = tmp_path / "ckpt.pt"
    params(run(launcher, "save", "sgd", ckpt))
    resumed = params(run(launcher, "resume", "sgd", ckpt, tamper="set-same"))
    assert resumed == {"0": uninterrupted["sgd"], "1": uninterrupted["sgd"]}


def test_parameter_replaced_by_another_shape_is_refused_by_name(launcher, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    params(run(launcher, "save", "sgd", ckpt))
    r = run(launcher, "resume", "sgd", ckpt, tamper="set-shape")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "parameter 0 (fc0.weight) was replaced after wrapping by a tensor of Float [97]" in out
