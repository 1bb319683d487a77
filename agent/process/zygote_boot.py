# ddprun's warm-start zygote (agent/process/zygote.hpp): a Python process that has imported the
# modules a training script imports first and forks each worker from there, so a restarted
# worker skips `import torch`. ddprun embeds this file and runs it as
#     <the workers' python> -u -c <loader> CONTROL_FD AGENT_PID MODULE,MODULE,... ROOM
# (the loader reads this file from CONTROL_FD; ROOM is spaces, the argv area a worker's command
# line is written into)
# with the workers' environment (the per-attempt variables aside) and CONTROL_FD one end of an
# AF_UNIX SOCK_SEQPACKET pair. It never touches an accelerator.
#
# Messages are JSON, one per datagram; descriptors travel as SCM_RIGHTS.
#   zygote -> agent  {"ready": {"import_s": s, "modules": [...], "missing": [...],
#                               "threads": n, "rss_kb": k}}
#   agent -> zygote  {"spawn": {"mode": "script"|"module", "target": path|name, "args": [...],
#                               "orig_argv": [...], "env": ["K=V", ...], "cwd": dir}}
#                    + [stdout, stderr]
#   zygote -> agent  {"spawned": pid} + [pidfd]   or   {"error": "why"}
#   zygote -> agent  {"exited": pid, "code": n, "maxrss": KiB} or {"exited": pid, "signal": n, ...}
# The zygote exits when the agent closes its end.
#
# A forked worker is set up as ddprun's fork+exec does for a cold one (child_process.cpp): its
# own session, SIGKILL when its parent (this zygote) dies, ptrace allowed to the agent, stdout
# and stderr, no other descriptor, the signal dispositions and mask a fresh interpreter has,
# the environment, directory, argv, sys.path[0] and __main__ of `python -u script.py` (or -m),
# fresh seeds for `random` and numpy, and its cold command line in /proc/PID/cmdline (what ps,
# pgrep -f and top show; the area keeps its size, so NULs pad it). Its exit status is reported
# once the rest of its process group was killed (the group id cannot be reused while it is a
# zombie).
#
# What a script can still tell apart: its parent (this zygote), the modules already imported,
# str hashes, whose seed is this process's in every worker (as if PYTHONHASHSEED were set), and
# one more thread: the flight-recorder responder (serve_flight_recorder, which the build puts
# before this file from worker-sdk/python/ddprun/flight_recorder.py), so that ddprun can name the
# collective a hung job waits in (and with it glibc's handler of its internal signal 33,
# SIGSETXID, which the first thread of any process installs: /proc/PID/status SigCgt).
import ctypes
import importlib
import json
import os
import signal
import socket
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61
ZYGOTE_FILE = "<ddprun-zygote>"
TORCH_DEFAULT_SEED = 67280421310721  # torch's fixed seed, where an import does not draw one
FRESH_MAIN = set()


def main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    agent_pid = int(sys.argv[2])
    modules = [m for m in sys.argv[3].split(",") if m]
    # What a fresh interpreter has, before this process changes anything.
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals()
                if signal.getsignal(s) is not None}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    global FRESH_MAIN
    FRESH_MAIN = set(sys.modules["__main__"].__dict__)  # what a new __main__ starts with
    started = time.monotonic()
    loaded, missing = [], []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as e:  # noqa: BLE001 - a missing module is reported, not fatal
            missing.append(f"{name}: {type(e).__name__}: {e}")
    send(ctl, {"ready": {"import_s": time.monotonic() - started, "modules": loaded,
                         "missing": missing, "threads": len(os.listdir("/proc/self/task")),
                         "rss_kb": rss_kb()}})
    serve(ctl, agent_pid, handlers, mask)


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def send(ctl, message, fds=()):
    data = json.dumps(message).encode()
    ctl.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                          bytes(memoryview(_ints(fds))))] if fds else [])


def _ints(fds):
    import array
    return array.array("i", fds)


def serve(ctl, agent_pid, handlers, mask):
    import array
    import select
    # SIGCHLD wakes the loop through a pipe (no handler runs Python code between selects).
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    me = os.getpid()
    while True:
        readable, _, _ = select.select([ctl.fileno(), wake_r], [], [])
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            reap(ctl)
        if ctl.fileno() not in readable:
            continue
        fds = array.array("i")
        data, ancdata, _, _ = ctl.recvmsg(1 << 20, socket.CMSG_SPACE(2 * fds.itemsize))
        if not data:
            return  # the agent is gone
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        request = json.loads(data)["spawn"]
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            send(ctl, {"error": f"a fork request needs stdout and stderr, got {len(fds)} fds"})
            continue
        # The answer waits until the child leads its own process group and has its parent-death
        # signal: from then on the agent's signals to the group reach it.
        settled_r, settled_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            ctl.detach()
            os.close(settled_r)
            worker(request, list(fds), me, agent_pid, handlers, mask, settled_w)
        os.close(settled_w)
        for fd in fds:
            os.close(fd)
        os.read(settled_r, 1)  # a byte, or EOF if it died first
        os.close(settled_r)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            send(ctl, {"error": f"pidfd_open: {e}"})
            continue
        send(ctl, {"spawned": pid}, [pidfd])
        os.close(pidfd)


def reap(ctl):
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        try:
            os.killpg(info.si_pid, signal.SIGKILL)  # what is left of its group: DataLoaders...
        except (ProcessLookupError, PermissionError):
            pass
        maxrss = os.wait4(info.si_pid, 0)[2].ru_maxrss  # KiB
        if info.si_code == os.CLD_EXITED:
            send(ctl, {"exited": info.si_pid, "code": info.si_status, "maxrss": maxrss})
        else:
            send(ctl, {"exited": info.si_pid, "signal": info.si_status, "maxrss": maxrss})


def worker(request, fds, zygote_pid, agent_pid, handlers, mask, settled):
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != zygote_pid:
            os._exit(128 + signal.SIGKILL)  # the zygote died before prctl
        libc.prctl(PR_SET_PTRACER, agent_pid, 0, 0, 0)
        os.write(settled, b"1")
        os.close(settled)
        out, err = fds  # what the agent gave it: a log file, a pipe, or the agent's own
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
        for sig, handler in handlers.items():
            try:
                signal.signal(sig, handler)
            except (OSError, ValueError, TypeError):
                pass
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.chdir(request["cwd"])
        env = dict(item.split("=", 1) for item in request["env"] if "=" in item)
        os.environ.clear()
        os.environ.update(env)
        reseed()
        sys.orig_argv[:] = request["orig_argv"]
        set_cmdline(request["orig_argv"])
        serve_flight_recorder()  # noqa: F821 - defined before this file (see above)
    except BaseException as e:  # noqa: BLE001 - the worker must not return into the zygote
        os.write(2, f"[ddprun] warm start of a worker failed: {e!r}\n".encode())
        os._exit(127)
    run(request)
    # The script ended: the interpreter finishes as after `python script.py` (atexit, exit 0),
    # never back in the zygote's loop.
    raise SystemExit(0)


def reseed():
    # Forked children share the zygote's random state; a fresh interpreter seeds from the OS
    # (and `import torch` draws its CPU generator's seed, where the zygote's shows it did).
    import random
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        if torch.initial_seed() != TORCH_DEFAULT_SEED:
            torch.default_generator.seed()


def set_cmdline(argv):
    """Writes `argv` over this process's argv area (NUL-padded), where /proc/PID/cmdline reads;
    an argument that does not fit is cut."""
    stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start, end = int(stat[45]), int(stat[46])  # fields 48 and 49: arg_start, arg_end
    data = b"".join(os.fsencode(a) + b"\0" for a in argv)[:end - start - 1]
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def fresh_main():
    """A new __main__ in sys.modules, as the interpreter makes one (not the zygote's own, which
    holds this file's names)."""
    import types
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = __builtins__
    if "__annotations__" in FRESH_MAIN:
        main_module.__annotations__ = {}
    sys.modules["__main__"] = main_module
    return main_module


def run(request):
    if request["mode"] == "module":
        import runpy
        sys.argv[:] = [request["target"]] + request["args"]
        sys.path[0] = os.getcwd()
        fresh_main()  # runpy runs the module in __main__'s namespace
        try:
            runpy._run_module_as_main(request["target"], alter_argv=True)
        except BaseException as e:  # noqa: BLE001
            finish(e)
        return
    path = request["target"]
    absolute = os.path.abspath(path)
    sys.argv[:] = [path] + request["args"]
    sys.path[0] = os.path.dirname(os.path.realpath(absolute))
    import importlib.machinery
    main_module = fresh_main()
    main_module.__file__ = absolute
    main_module.__cached__ = None
    main_module.__loader__ = importlib.machinery.SourceFileLoader("__main__", absolute)
    try:
        with open(absolute, "rb") as f:
            source = f.read()
        code = compile(source, absolute, "exec")
    except BaseException as e:  # noqa: BLE001
        finish(e)
        return
    try:
        exec(code, main_module.__dict__)
    except BaseException as e:  # noqa: BLE001
        finish(e)


def finish(e):
    """What the interpreter does with an exception a script left, without this file's frames."""
    if isinstance(e, SystemExit):
        raise e
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == ZYGOTE_FILE:
        tb = tb.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)  # the hook prints e.__traceback__
    if isinstance(e, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)


if __name__ == "__main__":
    main()
