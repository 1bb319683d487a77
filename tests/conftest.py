"""Shared fixtures for ddprun's integration tests.

ctest runs each test file with Debian's /usr/bin/python3 (torch 1.13) and tells it, through
the environment, where the build's binaries and the torch 2.x virtualenv are
(cmake/DdprunHelpers.cmake). Every test uses port 0 / free ports and its own temp dir, so
test files run in parallel.
"""
import os
import pathlib
import sys

import pytest

# tests/lib holds what the suites share (README.md there); every test file, and every helper
# module it imports, finds it on sys.path from here on.
sys.path.insert(0, str(pathlib.Path(__file__).parent / "lib"))
from testenv import (BIN_DIR, SDK_BIN_DIR, SOURCE_DIR, TORCH1_PYTHON, TORCH2_PYTHON,  # noqa: E402,F401
                     free_port, pid_alive, wait_for)
from jobs import cluster  # noqa: E402,F401  (the `cluster` fixture of the multi-node tests)


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
