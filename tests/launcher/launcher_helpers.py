"""Helpers for ddprun's launcher/agent integration tests (real processes, real workers)."""
import os
import subprocess

# tests/conftest.py, which pytest has put on sys.path, holds what every suite shares.
from conftest import SOURCE_DIR, TORCH1_PYTHON, free_port, pid_alive, wait_for  # noqa: F401

EXAMPLES = SOURCE_DIR / "examples" / "python"


def example(name):
    return str(EXAMPLES / name)


# The variables ddprun gives every worker that torchrun does not (agent/ENVIRONMENT.md): the
# heartbeat socket, the in-memory checkpoints, the flight-recorder directory (with torch's dump
# prefix in it) and faulthandler for Python workers. Parity tests allow exactly these.
DDPRUN_ONLY_ENV = frozenset({
    "DDPRUN_HEARTBEAT_SOCKET", "DDPRUN_MEMORY_CHECKPOINT_DIR", "DDPRUN_MEMORY_CHECKPOINT_LIMIT",
    "DDPRUN_FLIGHT_RECORDER", "TORCH_FR_DUMP_TEMP_FILE", "PYTHONFAULTHANDLER"})

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
