"""Helpers for ddprun's launcher/agent integration tests (real processes, real workers)."""
import os
import subprocess

# tests/conftest.py, which pytest has put on sys.path, holds what every suite shares.
from conftest import SOURCE_DIR, TORCH1_PYTHON, free_port, pid_alive, wait_for  # noqa: F401

EXAMPLES = SOURCE_DIR / "examples" / "python"


def example(name):
    return str(EXAMPLES / name)


def clean_env(python=TORCH1_PYTHON, **extra):
    """The environment a test launches ddprun/torchrun with: no leftover PET_/torchelastic
    variables from the caller, PYTHON_EXEC pointing at the interpreter the workers should use."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "OMP_NUM_THREADS"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHON_EXEC"] = python
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env=None, timeout=120, **kwargs):
    """Runs a command to completion, capturing text output."""
    return subprocess.run([str(c) for c in cmd], env=env or clean_env(), timeout=timeout,
                          capture_output=True, text=True, **kwargs)
