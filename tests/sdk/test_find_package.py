"""A C++ user follows worker-sdk/README.md: install the SDK, find_package(ddprun) in their own
CMake project, build, and run it as a 2-rank DDP job under the launcher."""
import subprocess

from sdkutil import BUILD_DIR, SOURCE_DIR


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r


def test_installed_package_builds_and_runs_a_job(launcher, tmp_path):
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", str(BUILD_DIR / "worker-sdk"), "--prefix", str(prefix)])
    assert (prefix / "include" / "ddprun" / "ddp.hpp").is_file()
    build = tmp_path / "build"
    configure = ["cmake", "-S", str(SOURCE_DIR / "tests" / "sdk" / "consumer"), "-B", str(build),
                 "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}"]
    # Configured twice, as an IDE or a changed CMakeLists.txt does: the second configure must find
    # the same LibTorch as the first (with a torch 2.x SDK it once found Debian's Caffe2 from the
    # cache and linked LibTorch 1.13).
    for _ in range(2):
        run(configure)
        run(["cmake", "--build", str(build), "-j", "2"], timeout=800)
        r = launcher.run(2, [str(build / "my_ddp_job")], timeout=120)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "rank 0 of 2 done" in out and "rank 1 of 2 done" in out
        assert "epoch 2 loss" in out
