"""The SDK's Join gives the numbers PyTorch's DistributedDataParallel.join() does when ranks
have different numbers of batches: a real two-rank Gloo job on CPU under the launcher, once with
the C++ SDK (join_worker.cpp) and once with PyTorch of the SDK's torch version (join_ref.py),
same model (with BatchNorm buffers), data, seed and optimizer; every rank's final parameters and
buffers are compared, and must also be equal across ranks."""
import json

import pytest

from sdkutil import SOURCE_DIR, matching_python, sdk_bin

# As in test_ddp_equivalence.py: both sides run the same LibTorch kernels, and with two ranks
# each reduced element is a + b (or a + 0 once a rank joined), exact to commute; the divisors
# are 2 or 1. Bitwise equality is expected; 1e-6 relative leaves room for a few float32
# rounding differences over the steps. A joined rank that contributed anything but zeros, a
# wrong divisor or the wrong final model is off by far more.
RTOL, ATOL = 1e-6, 1e-7


def run(launcher, tmp_path, impl, args):
    out = tmp_path / f"{impl}-{abs(hash(tuple(args)))}"
    out.mkdir()
    full = [*args, "--out", str(out)]
    if impl == "cpp":
        argv = [sdk_bin("join_worker"), *full]
    else:
        argv = [matching_python(), str(SOURCE_DIR / "tests" / "sdk" / "join_ref.py"), *full]
    r = launcher.run(2, argv, timeout=240)
    return r, [json.loads((out / f"{impl}_rank{rank}.json").read_text())
               if (out / f"{impl}_rank{rank}.json").exists() else None for rank in (0, 1)]


def assert_close(got, ref, what):
    assert got.keys() == ref.keys(), what
    for name, want in ref.items():
        have = got[name]
        if want is None or have is None:  # an undefined .grad on one side must be so on both
            assert have is None and want is None, (what, name, have, want)
            continue
        assert len(have) == len(want), (what, name)
        worst = max((abs(a - b) - (ATOL + RTOL * abs(b)) for a, b in zip(have, want)), default=0)
        assert worst <= 0, (what, name, have, want)


CASES = {
    "rank1-longer": ["--batches", "3,7"],
    "rank0-longer": ["--batches", "6,2"],
    "divide-by-training": ["--batches", "2,5", "--divide-initial", "0"],
    "find-unused": ["--batches", "4,7", "--find-unused", "1"],
    "no-sync": ["--batches", "3,8", "--no-sync-every", "3"],
    "comm-hook": ["--batches", "5,2", "--hook", "allreduce"],
    "even": ["--batches", "4,4"],
    "one-rank-empty": ["--batches", "0,3"],
    # .grad after the join: the joined rank keeps its own last averaged gradient.
    "grads-after-join": ["--batches", "3,6", "--zero-grad", "first"],
}


@pytest.mark.parametrize("case", CASES)
def test_join_matches_pytorch(launcher, tmp_path, case):
    args = CASES[case]
    r, cpp = run(launcher, tmp_path, "cpp", args)
    assert r.returncode == 0, r.stdout + r.stderr
    r, py = run(launcher, tmp_path, "py", args)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert_close(cpp[rank]["params"], py[rank]["params"], (case, rank, "params"))
        assert_close(cpp[rank]["buffers"], py[rank]["buffers"], (case, rank, "buffers"))
        assert_close(cpp[rank]["grads"], py[rank]["grads"], (case, rank, "grads"))
    # Everyone ends with the same model (the last joiner's), though they ran different steps.
    assert cpp[0]["steps"] != cpp[1]["steps"] or case == "even"
    assert_close(cpp[0]["params"], cpp[1]["params"], (case, "rank 0 vs rank 1"))
    assert_close(cpp[0]["buffers"], cpp[1]["buffers"], (case, "rank 0 vs rank 1 buffers"))


def test_join_changes_the_outcome(launcher, tmp_path):
    """The comparison can fail: dividing by the ranks still training gives other parameters
    than dividing by the initial world size."""
    _, a = run(launcher, tmp_path, "cpp", ["--batches", "2,5"])
    _, b = run(launcher, tmp_path, "cpp", ["--batches", "2,5", "--divide-initial", "0"])
    with pytest.raises(AssertionError):
        assert_close(a[0]["params"], b[0]["params"], "initial vs training divisor")


def test_throw_on_early_termination(launcher, tmp_path):
    """Every rank stops with an error once one runs out of data, as PyTorch's does."""
    args = ["--batches", "2,5", "--throw-early", "1"]
    r, cpp = run(launcher, tmp_path, "cpp", args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "throw_on_early_termination" in cpp[0]["error"], cpp
    assert "ran out of inputs" in cpp[1]["error"], cpp
    r, py = run(launcher, tmp_path, "py", args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all("error" in rep for rep in py), py

