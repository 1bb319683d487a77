"""Where the build and the two Python generations are, and the small things every test suite
uses: free ports, whether a pid is alive, bounded waits, the environment ddprun is started with.

ctest runs each test file with Debian's /usr/bin/python3 (torch 1.13) and tells it, through
the environment, where the build's binaries and the torch 2.x virtualenv are
(cmake/DdprunHelpers.cmake). tests/conftest.py re-exports these names, so older
`from conftest import ...` lines keep working.
"""
import os
import pathlib
import socket
import subprocess
import time

SOURCE_DIR = pathlib.Path(os.environ.get("DDPRUN_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BIN_DIR = pathlib.Path(os.environ.get("DDPRUN_BIN_DIR", SOURCE_DIR / "build" / "bin"))
SDK_BIN_DIR = pathlib.Path(os.environ.get("DDPRUN_SDK_BIN_DIR", BIN_DIR))
TORCH1_PYTHON = os.environ.get("DDPRUN_TORCH1_PYTHON", "/usr/bin/python3")
TORCH2_PYTHON = os.environ.get(
    "DDPRUN_TORCH2_PYTHON",
    os.path.expanduser("~/.cache/ddprun/torch2-venv/bin/python"))
EXAMPLES = SOURCE_DIR / "examples" / "python"

# The variables ddprun gives every worker that torchrun does not (agent/ENVIRONMENT.md): the
# heartbeat socket, the in-memory checkpoints, the flight-recorder directory (with torch's dump
# prefix in it) and faulthandler for Python workers. Parity tests allow exactly these.
DDPRUN_ONLY_ENV = frozenset({
    "DDPRUN_HEARTBEAT_SOCKET", "DDPRUN_MEMORY_CHECKPOINT_DIR", "DDPRUN_MEMORY_CHECKPOINT_LIMIT",
    "DDPRUN_FLIGHT_RECORDER", "TORCH_FR_DUMP_TEMP_FILE", "PYTHONFAULTHANDLER"})


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
