"""Helpers of the SDK's integration tests: which launcher starts multi-rank jobs.

The tests launch through ddprun, as users do. DDPRUN_SDK_TEST_LAUNCHER=torchrun (environment, or
the CMake cache variable of that name) switches them to Debian's torchrun 1.13, whose worker
environment is the same contract; it exists only for trees where ddprun is not built.
"""
import os
import pathlib
import re
import subprocess

# The same environment tests/conftest.py reads (set by ctest, see cmake/DdprunHelpers.cmake).
SOURCE_DIR = pathlib.Path(os.environ.get("DDPRUN_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("DDPRUN_BUILD_DIR", SOURCE_DIR / "build"))
BIN_DIR = pathlib.Path(os.environ.get("DDPRUN_BIN_DIR", SOURCE_DIR / "build" / "bin"))
SDK_BIN_DIR = pathlib.Path(os.environ.get("DDPRUN_SDK_BIN_DIR", BIN_DIR))
TORCH1_PYTHON = os.environ.get("DDPRUN_TORCH1_PYTHON", "/usr/bin/python3")
TORCH2_PYTHON = os.environ.get(
    "DDPRUN_TORCH2_PYTHON", os.path.expanduser("~/.cache/ddprun/torch2-venv/bin/python"))

LAUNCHER = os.environ.get("DDPRUN_SDK_TEST_LAUNCHER") or "ddprun"
TORCH_VERSION = os.environ.get("DDPRUN_SDK_TORCH_VERSION", "1.13")


def sdk_bin(name):
    path = SDK_BIN_DIR / name
    assert path.exists(), f"{path} not built"
    return str(path)


def matching_python():
    """The Python whose torch matches the LibTorch this build's SDK was compiled against."""
    return TORCH1_PYTHON if TORCH_VERSION.startswith("1.") else TORCH2_PYTHON


class Launcher:
    def __init__(self, log_dir):
        self.log_dir = pathlib.Path(log_dir)
        self.name = LAUNCHER

    def command(self, nproc, *, max_restarts=0):
        """The launch line up to (not including) the worker binary."""
        if self.name == "ddprun":
            path = BIN_DIR / "ddprun"
            assert path.exists(), (
                f"{path} not built; set DDPRUN_SDK_TEST_LAUNCHER=torchrun to use torchrun 1.13")
            return [str(path), "--standalone", f"--nproc_per_node={nproc}",
                    f"--max_restarts={max_restarts}", "--log_dir", str(self.log_dir),
                    "--no_python"]
        if self.name == "torchrun":
            # Debian's torchrun 1.13 needs redirects on Python 3.11 (see torchrun-contract.md).
            return [TORCH1_PYTHON, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={nproc}", f"--max_restarts={max_restarts}",
                    "--monitor_interval", "0.2", "--redirects", "1", "--tee", "1",
                    "--log_dir", str(self.log_dir), "--no_python"]
        raise AssertionError(f"DDPRUN_SDK_TEST_LAUNCHER={self.name}: expected ddprun or torchrun")

    def run(self, nproc, argv, *, max_restarts=0, timeout=300, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("OMP_NUM_THREADS", "1")
        return subprocess.run(self.command(nproc, max_restarts=max_restarts) + list(argv),
                              capture_output=True, text=True, timeout=timeout, env=full_env)


def checksum_of(output):
    found = re.findall(r"final params checksum: (\S+)", output)
    assert len(found) == 1, f"expected one checksum line in:\n{output}"
    return float(found[0])
