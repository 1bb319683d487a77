"""Object collectives, reduce and barrier(timeout) of the C++ SDK under the launcher, against
torch.distributed doing the same: every rank must end up with the same bytes, shapes and values."""
import filecmp

from sdkutil import matching_python, sdk_bin, SOURCE_DIR

WORKER_PY = SOURCE_DIR / "tests" / "sdk" / "object_collectives_worker.py"


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_same_results_as_torch_distributed(launcher, tmp_path):
    cpp, py = tmp_path / "cpp", tmp_path / "py"
    r = launcher.run(2, [sdk_bin("object_collectives_worker"), str(cpp)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    r = launcher.run(2, [matching_python(), str(WORKER_PY), str(py)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    files = tree(py)
    assert tree(cpp) == files
    # Every case is there: two ranks' strings, tensors, the 1 MiB object, gather on dst only.
    for name in ["rank0/ag_str_0.bin", "rank1/ag_big_0.bin", "rank0/ag_t_1.shape",
                 "rank0/bc_2.bin", "rank1/g_1.bin", "rank1/g_t_1_1.bin", "rank0/red_product.bin"]:
        assert name in files, name
    assert not any(f.startswith("rank0/g_") for f in files)
    assert (cpp / "rank1/ag_big_0.bin").stat().st_size == 1 << 20
    assert (cpp / "rank0/ag_str_0.bin").read_bytes() == b""
    assert (cpp / "rank1/ag_t_1.shape").read_text() == "2,3\n"
    _, mismatch, errors = filecmp.cmpfiles(cpp, py, files, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


def test_barrier_timeout_names_the_missing_rank(launcher):
    r = launcher.run(2, [sdk_bin("object_collectives_worker"), "--barrier-timeout"], timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "barrier timed out after 500 ms on rank 0; rank(s) not arrived: 1" in out, out
