"""Shared fixtures for ddprun's integration tests.

ctest runs each test file with Debian's /usr/bin/python3 (torch 1.13) and tells it, through
the environment, where the build's binaries and the torch 2.x virtualenv are
(cmake/DdprunHelpers.cmake). Every test uses port 0 / free ports and its own temp dir, so
test files run in parallel.
"""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("DDPRUN_SOURCE_DIR", pathlib.Path(__file__).parents[1]))
BIN_DIR = pathlib.Path(os.environ.get("DDPRUN_BIN_DIR", SOURCE_DIR / "build" / "bin"))
SDK_BIN_DIR = pathlib.Path(os.environ.get("DDPRUN_SDK_BIN_DIR", BIN_DIR))
TORCH1_PYTHON = os.environ.get("DDPRUN_TORCH1_PYTHON", "/usr/bin/python3")
TORCH2_PYTHON = os.environ.get(
    "DDPRUN_TORCH2_PYTHON",
    os.path.expanduser("~/.cache/ddprun/torch2-venv/bin/python"))


def free_port(host="127.0.0.1"):
    """A port that was free a moment ago (prefer port 0 where the program supports it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone between the kill and the read
        return False


def wait_for(predicate, timeout=10.0, interval=0.01):
    """Waits for a condition that has no event to wait on (e.g. a file written by a worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


@pytest.fixture
def bin_dir():
    return BIN_DIR


@pytest.fixture
def ddprun():
    path = BIN_DIR / "ddprun"
    assert path.exists(), f"{path} not built"
    return str(path)


@pytest.fixture
def ddpstore():
    path = BIN_DIR / "ddpstore"
    assert path.exists(), f"{path} not built"
    return str(path)


@pytest.fixture
def torch1_python():
    return TORCH1_PYTHON


@pytest.fixture
def torch2_python():
    assert os.path.exists(TORCH2_PYTHON), f"{TORCH2_PYTHON} missing: run scripts/setup"
    return TORCH2_PYTHON


@pytest.fixture
def torchrun1():
    """Debian's torchrun 1.13 (needs the redirect workaround on Python 3.11)."""
    return [TORCH1_PYTHON, "-m", "torch.distributed.run"]


@pytest.fixture
def torchrun2(torch2_python):
    return [torch2_python, "-m", "torch.distributed.run"]
