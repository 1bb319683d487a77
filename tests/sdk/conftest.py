"""Fixtures of the SDK's integration tests (helpers live in sdkutil.py)."""
import pytest

from sdkutil import Launcher


@pytest.fixture
def launcher(tmp_path):
    """Starts multi-rank jobs through ddprun (or torchrun 1.13, see sdkutil.py)."""
    return Launcher(tmp_path / "logs")
