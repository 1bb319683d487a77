"""Helpers for ddprun's launcher/agent integration tests (real processes, real workers)."""
# tests/lib/testenv.py (on sys.path through tests/conftest.py) holds what every suite shares.
from testenv import (DDPRUN_ONLY_ENV, EXAMPLES, SOURCE_DIR, TORCH1_PYTHON, clean_env,  # noqa: F401
                     free_port, pid_alive, run, wait_for)


def example(name):
    return str(EXAMPLES / name)
