"""Helpers for ddprun's launcher/agent integration tests (real processes, real workers)."""
import os
import pathlib
import subprocess

SOURCE_DIR = pathlib.Path(os.environ.get("DDPRUN_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
TORCH1_PYTHON = os.environ.get("DDPRUN_TORCH1_PYTHON", "/usr/bin/python3")
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


def free_port(host="127.0.0.1"):
    """A port that was free a moment ago."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pid_alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout=10.0, interval=0.005):
    """Waits for a condition that has no event to wait on (e.g. a file a worker writes)."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
