"""The SDK's SyncBatchNorm trains as BatchNorm over the global batch: sync_bn_worker.cpp runs a
conv + linear model whose BatchNorm2d/1d are converted by ddprun::convert_sync_batchnorm, under
DistributedDataParallel, as a real two-rank Gloo job on CPU under the launcher, each rank on its
slice of one batch (even, uneven, and one rank with no rows). sync_bn_ref.py, with the Python
torch of the SDK's LibTorch version, runs the same model with plain BatchNorm on the whole batch
in one process (PyTorch's own SyncBatchNorm refuses CPU tensors); see there for the loss
weighting that makes the two follow the same gradient. Per-step outputs, final parameters,
running statistics and the eval-mode output are compared."""
import json
import os
import subprocess

import pytest

from sdkutil import SOURCE_DIR, matching_python, sdk_bin

# The two sides compute the same numbers in different orders: per rank, then across ranks (batch
# statistics combined in double, the input-gradient sums all-reduced in float32), against
# BatchNorm's kernel over all rows at once; the C++ side also normalises as x * a + b with its
# own a and b. Each is a float32 rounding or two (1 ulp = 6e-8 relative) per value per step; SGD
# with momentum over 4 steps through two BatchNorms, which divide by batch standard deviations
# of order 0.1-1, amplifies them to some 1e-6 relative. 2e-5 relative (plus 2e-6 absolute for
# values near zero) leaves a margin of ten: measured with LibTorch 1.13 and 2.x, the worst value
# used 8 % of it (4.8e-7 absolute). A wrong statistic (local instead of global, biased running
# variance, an un-reduced backward sum) is off by 1e-2 or more.
RTOL, ATOL = 2e-5, 2e-6
STEPS = "4"
REF = str(SOURCE_DIR / "tests" / "sdk" / "sync_bn_ref.py")


def worker_reports(launcher, tmp_path, split, loss):
    out = tmp_path / f"cpp-{split}-{loss}"
    out.mkdir()
    argv = [sdk_bin("sync_bn_worker"), "--split", split, "--loss", loss, "--steps", STEPS,
            "--out", str(out)]
    r = launcher.run(2, argv, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads((out / f"cpp_rank{rank}.json").read_text()) for rank in (0, 1)]


def reference(tmp_path, split, loss, impl="batchnorm"):
    out = tmp_path / f"ref-{impl}-{split}-{loss}"
    out.mkdir()
    r = subprocess.run([matching_python(), REF, "--impl", impl, "--split", split, "--loss", loss,
                        "--steps", STEPS, "--out", str(out)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((out / "ref.json").read_text())


def assert_close(got, want, what, rtol, atol):
    assert len(got) == len(want), what
    worst = max((abs(g - w) - (atol + rtol * abs(w)) for g, w in zip(got, want)), default=0.0)
    assert worst <= 0, (what, got, want)


def assert_matches(cpp, ref, rtol=RTOL, atol=ATOL):
    def close(got, want, what):
        assert_close(got, want, what, rtol, atol)

    for rank, rep in enumerate(cpp):
        assert rep["converted"] == ["features.1", "head.1"], rep["converted"]
        first, count = rep["rows"]
        assert rep["params"].keys() == ref["params"].keys()
        for name, want in ref["params"].items():
            close(rep["params"][name], want, (rank, name))
        assert rep["buffers"].keys() == ref["buffers"].keys()
        for name, want in ref["buffers"].items():
            close(rep["buffers"][name], want, (rank, name))
        for step, (got, want) in enumerate(zip(rep["outputs"], ref["outputs"])):
            close(got, want[first * 2:(first + count) * 2], (rank, "output", step))
        close(rep["eval_output"], ref["eval_output"], (rank, "eval_output"))


@pytest.mark.parametrize("split,loss", [
    ("even", "scaled"),
    ("even", "mean"),      # equal slices: per-rank means average to the global mean
    ("uneven", "scaled"),  # 6 + 2 rows
    ("uneven", "mean"),    # per-rank means: rows weighted 1 / (world * rows of their rank)
    ("empty", "scaled"),   # rank 1 has no rows yet takes part in every collective
])
def test_trains_as_batchnorm_on_the_global_batch(launcher, tmp_path, split, loss):
    cpp = worker_reports(launcher, tmp_path, split, loss)
    ref = reference(tmp_path, split, loss)
    assert_matches(cpp, ref)
    # Every rank combines the same gathered statistics in the same order: identical buffers.
    assert cpp[0]["buffers"] == cpp[1]["buffers"]
    assert cpp[0]["buffers"]["features.1.num_batches_tracked"] == [float(STEPS)]


def test_per_rank_batchnorm_would_not_match(launcher, tmp_path):
    # Guards the comparison itself: the same job with BatchNorm normalising each rank's rows on
    # their own (DDP without SyncBatchNorm) is far outside the tolerance.
    cpp = worker_reports(launcher, tmp_path, "uneven", "mean")
    local = reference(tmp_path, "uneven", "mean", impl="per-rank-batchnorm")
    with pytest.raises(AssertionError):
        assert_close(cpp[1]["outputs"][0], local["outputs"][0][12:16], "output", RTOL, ATOL)
    with pytest.raises(AssertionError):
        assert_matches(cpp, local)


def cuda_devices():
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    r = subprocess.run([matching_python(), "-c", probe], capture_output=True, text=True,
                       timeout=120)
    return int(r.stdout.strip() or 0) if r.returncode == 0 else 0


@pytest.mark.parametrize("split", ["even", "uneven"])
def test_pytorch_syncbatchnorm_on_cuda_matches_the_reference(launcher, tmp_path, split):
    """The definition the other tests rely on, checked against PyTorch's real SyncBatchNorm
    (CUDA + NCCL, so only where two GPUs are present). cuDNN and CUDA kernels differ from the CPU
    reference in summation order and use float32 Welford sums: 1e-4 relative."""
    if cuda_devices() < 2:
        pytest.skip("PyTorch's SyncBatchNorm needs CUDA; two GPUs are not present")
    out = tmp_path / f"torch-{split}"
    out.mkdir()
    r = launcher.run(2, [matching_python(), REF, "--impl", "torch-syncbn", "--split", split,
                         "--loss", "scaled", "--steps", STEPS, "--out", str(out)], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    ref = reference(tmp_path, split, "scaled")
    for rank in (0, 1):
        rep = json.loads((out / f"torch_rank{rank}.json").read_text())
        rep["converted"] = ["features.1", "head.1"]
        assert_matches([rep], ref, rtol=1e-4, atol=1e-5)
