"""The SDK's DistributedDataParallel gives the numbers PyTorch's does: find_unused_parameters,
static_graph and the bucket rebuild, each run as a real two-rank Gloo job on CPU under the
launcher, once with the C++ SDK (ddp_equiv.cpp) and once with PyTorch's DDP of the SDK's torch
version (ddp_equiv_ref.py): same model, data, seed and optimizer; final parameters, which .grad
are None, and the bucket layout are compared."""
import json

import pytest

from sdkutil import SOURCE_DIR, matching_python, sdk_bin

# Both sides run the same LibTorch build and kernels (one thread each), and with two ranks every
# reduced element is a single sum a + b, which is exact to commute; PyTorch scales each gradient
# by 1/2 before the all-reduce as the SDK does. So the results are expected to be bitwise equal.
# The tolerance leaves room for a few float32 rounding differences (1 ulp = 1.2e-7 relative) per
# step over 6 steps of SGD with momentum, should a kernel pick another summation order (e.g. a
# vectorised path): 1e-6 relative, 1e-7 absolute for values near zero. A wrong reduction (an
# unused parameter's missing zeros, a sum not divided by the world) is off by 10 % or more.
RTOL, ATOL = 1e-6, 1e-7
STEPS = "6"


def run_job(launcher, tmp_path, impl, mode, model, pattern):
    out = tmp_path / f"{impl}-{mode}-{model}-{pattern}"
    out.mkdir()
    args = ["--mode", mode, "--model", model, "--pattern", pattern, "--steps", STEPS,
            "--out", str(out)]
    if impl == "cpp":
        argv = [sdk_bin("ddp_equiv"), *args]
    else:
        argv = [matching_python(), str(SOURCE_DIR / "tests" / "sdk" / "ddp_equiv_ref.py"), *args]
    r = launcher.run(2, argv, timeout=240)
    return r, out


def reports(launcher, tmp_path, impl, mode, model, pattern):
    r, out = run_job(launcher, tmp_path, impl, mode, model, pattern)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads((out / f"{impl}_rank{rank}.json").read_text()) for rank in (0, 1)]


def max_mismatch(a, b):
    """The worst |a - b| beyond the tolerance, 0 when all close."""
    worst = 0.0
    for x, y in zip(a, b):
        worst = max(worst, abs(x - y) - (ATOL + RTOL * abs(y)))
    return worst


def assert_same_numbers(cpp, py):
    for rank in (0, 1):
        assert cpp[rank]["params"].keys() == py[rank]["params"].keys()
        for name, ref in py[rank]["params"].items():
            got = cpp[rank]["params"][name]
            assert len(got) == len(ref), name
            assert max_mismatch(got, ref) <= 0, (rank, name, got, ref)
        assert sorted(cpp[rank]["grad_none"]) == sorted(py[rank]["grad_none"]), rank


CASES = {
    # find_unused_parameters: the extra head is used by one rank on some steps, by none on others
    # (then momentum still moves it); "never" is unused everywhere, so its .grad stays None.
    "find_unused-branch": ("find_unused", "branch", "steps"),
    # A frozen head (requires_grad false: not DDP's business) and a dead one (no gradient).
    "find_unused-frozen": ("find_unused", "frozen", "always"),
    # static_graph: the per-rank unused set is the same every step (rank 1 takes the branch).
    "static-branch": ("static", "branch", "rank"),
    "static-frozen": ("static", "frozen", "always"),
    # Default mode: every parameter used; buckets rebuilt in ready order.
    "default-order": ("default", "order", "always"),
}


@pytest.mark.parametrize("case", CASES)
def test_same_parameters_as_pytorch(launcher, tmp_path, case):
    mode, model, pattern = CASES[case]
    cpp = reports(launcher, tmp_path, "cpp", mode, model, pattern)
    py = reports(launcher, tmp_path, "py", mode, model, pattern)
    assert_same_numbers(cpp, py)
    if model != "order":
        assert "never.weight" in cpp[0]["grad_none"] and "never.bias" in cpp[0]["grad_none"]
    if model == "branch" and mode == "find_unused":
        assert "extra.weight" not in cpp[1]["grad_none"]  # rank 0's gradient reached rank 1
    if mode != "find_unused":
        # PyTorch rebuilds here too: the same layout (used parameters in ready order, the unused
        # ones last with static_graph).
        assert cpp[0]["rebuilt"] and cpp[0]["buckets"] == py[0]["buckets"]
    else:
        assert not cpp[0]["rebuilt"]  # as PyTorch: no rebuild with find_unused_parameters


def test_rebuilt_buckets_follow_rank0_ready_order(launcher, tmp_path):
    cpp = reports(launcher, tmp_path, "cpp", "default", "order", "always")
    r0, r1 = cpp
    flat = [i for bucket in r0["buckets"] for i in bucket]
    assert flat == r0["ready_order"], r0
    assert sorted(flat) == list(range(6))
    # Rank 1 runs its heads in the other order, so its own ready order differs, yet it uses
    # rank 0's: identical buckets on both ranks.
    assert r1["ready_order"] != r0["ready_order"], (r0, r1)
    assert r1["buckets"] == r0["buckets"]
    # The caps hold (first bucket 512 bytes, then 25 MiB) and the layout did change: the initial
    # one is reverse parameter order, which this model does not produce gradients in.
    assert len(r0["buckets"]) > 1
    initial = [i for bucket in r0["initial_buckets"] for i in bucket]
    assert initial == [5, 4, 3, 2, 1, 0] and flat != initial


@pytest.mark.parametrize("model,pattern,unused,used", [
    ("branch", "steps", ["extra.weight", "never.weight", "never.bias"], ["fc1.weight"]),
    ("frozen", "always", ["never.weight", "never.bias"], ["extra.weight", "fc1.weight"]),
])
def test_without_find_unused_parameters_the_error_names_them(launcher, tmp_path, model, pattern,
                                                              unused, used):
    r, _ = run_job(launcher, tmp_path, "cpp", "default", model, pattern)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "parameters got no gradient in this backward pass" in out, out
    assert "find_unused_parameters" in out
    # Each rank's message names the parameters it got no gradient for.
    messages = " ".join(line for line in out.splitlines() if "parameters got no gradient" in line)
    for name in unused:
        assert name in messages, messages
    for name in used:
        assert name not in messages, messages


def test_static_graph_rejects_a_graph_that_changes(launcher, tmp_path):
    # The branch is used by rank 0 on step 0 only and by rank 1 from step 2 on.
    r, _ = run_job(launcher, tmp_path, "cpp", "static", "branch", "steps")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "static_graph" in out and "extra.weight" in out, out
