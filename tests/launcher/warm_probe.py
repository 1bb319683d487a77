"""What a worker can observe about how it was started, written as JSON to
$PROBE_OUT/<attempt>-<rank>.json (test_warm_start.py compares a cold start with a warm one).

"state" must be equal between a cold and a warm worker; "volatile" holds what differs between
any two processes (random seeds, the parent's pid). Rank 1 exits 3 at attempt 0, so a job with
--max-restarts 1 is observed at its restart too.
"""
import ctypes
import json
import os
import random
import re
import resource
import signal
import sys

MAIN_GLOBALS = {k: re.sub(r" at 0x[0-9a-f]+", "", repr(v)) for k, v in globals().items()
                if k != "__builtins__"}


def fd_table():
    """Descriptor -> [kind or path, flags]; the listing's own descriptor is in both."""
    out = {}
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            with open(f"/proc/self/fdinfo/{name}") as f:
                flags = f.read().split("flags:")[1].split()[0]
        except OSError:
            continue
        out[name] = [target.split(":")[0] if ":" in target else target, flags]
    return out


def proc_status(*keys):
    with open("/proc/self/status") as f:
        lines = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: lines[k].strip() for k in keys}


def handler_kind(h):
    for name in ("SIG_DFL", "SIG_IGN", "default_int_handler"):
        if h is getattr(signal, name):
            return name
    return repr(h)


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


libc = ctypes.CDLL(None, use_errno=True)
pdeath = ctypes.c_int()
libc.prctl(2, ctypes.byref(pdeath), 0, 0, 0)  # PR_GET_PDEATHSIG
umask = os.umask(0)
os.umask(umask)
state = {
    "globals": MAIN_GLOBALS,
    "name": __name__,
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "executable": sys.executable,
    "prefix": [sys.prefix, sys.base_prefix, sys.exec_prefix],
    "path": sys.path,
    "flags": repr(sys.flags),
    "warnoptions": sys.warnoptions,
    "stdio": [[s.fileno(), s.encoding, s.errors, s.line_buffering, s.write_through, s.isatty()]
              for s in (sys.stdin, sys.stdout, sys.stderr) if s is not None],
    "env": dict(os.environ),
    "cwd": os.getcwd(),
    "umask": umask,
    "signals": {str(int(s)): handler_kind(signal.getsignal(s))
                for s in signal.valid_signals() if signal.getsignal(s) is not None},
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "status": proc_status("SigBlk", "SigIgn", "SigCgt", "NoNewPrivs", "Seccomp", "Threads",
                          "Cpus_allowed_list"),
    "fds": fd_table(),
    "rlimits": {n: resource.getrlimit(getattr(resource, n))
                for n in dir(resource) if n.startswith("RLIMIT_")},
    "own_session": os.getsid(0) == os.getpid(),
    "own_group": os.getpgid(0) == os.getpid(),
    "pdeathsig": pdeath.value,
    "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
    "nice": os.nice(0),
    "cmdline": read("/proc/self/cmdline", "rb").rstrip(b"\0").decode().split("\0"),
    "comm": read("/proc/self/comm"),
    "exe": os.readlink("/proc/self/exe"),
}
import torch  # noqa: E402  after the above: a cold worker has not imported it yet

state["torch"] = {"threads": torch.get_num_threads(),
                  "interop_threads": torch.get_num_interop_threads(),
                  "default_dtype": str(torch.get_default_dtype()),
                  "grad_enabled": torch.is_grad_enabled()}
volatile = {"pid": os.getpid(), "ppid": os.getppid(), "random": random.random(),
            "torch_seed": torch.initial_seed(), "torch_rand": torch.rand(1).item()}
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
with open(os.path.join(os.environ["PROBE_OUT"], f"{attempt}-{rank}.json"), "w") as f:
    json.dump({"state": state, "volatile": volatile}, f, indent=1, sort_keys=True)
if attempt == "0" and rank == "1":
    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(
            os.path.join(os.environ["PROBE_OUT"], "0-0.json")):
        time.sleep(0.01)  # rank 0 observed too before the restart stops it
    sys.exit(3)
