"""serve_flight_recorder(): lets ddprun read this worker's flight recorder when the job hangs.

torch 2.x records the collectives each process group ran (its flight recorder), but a gloo
process group cannot be asked for that record from outside the process. When ddprun judges a
hang it writes a request file into the directory it names in DDPRUN_FLIGHT_RECORDER; a thread
started here sees it within 0.1 s and answers with torch's JSON dump in
`<dir>/rank_<RANK>.json` (written whole: temp file, then rename), or with
`{"ddprun_no_trace": why}` when there is nothing to dump (torch 1.13, no process group). ddprun
then names the rank the others wait for and the collective they wait in.

Workers that ddprun starts warm (--warm-start) get this without calling it; `ddprun.heartbeat()`
starts it too. It is harmless elsewhere: without DDPRUN_FLIGHT_RECORDER it does nothing. The
thread is a plain `_thread` (not in `threading.enumerate()`), polls one file's status ten times a
second, imports nothing and holds no descriptor between requests.
"""
import json as _json
import os as _os
import sys as _sys
import time as _time

_FLIGHT_RECORDER_POLL_S = 0.1
_flight_recorder_pid = None  # the process whose thread runs (a forked child of it never does)


def _flight_recorder_dump():
    """torch's JSON dump of this process's flight recorder, or a JSON object saying why not."""
    c10d = _sys.modules.get("torch._C._distributed_c10d")
    if c10d is None:
        c10d = getattr(_sys.modules.get("torch._C"), "_distributed_c10d", None)
    if c10d is None or "torch.distributed" not in _sys.modules:
        return _json.dumps({"ddprun_no_trace": "torch.distributed is not in use"}).encode()
    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json",
                                                                 None)
    if dump is None:
        return _json.dumps({"ddprun_no_trace": "this torch has no flight recorder"}).encode()
    try:
        body = _as_bytes(dump())
    except Exception as e:  # noqa: BLE001 - the answer says what went wrong
        return _json.dumps({"ddprun_no_trace": f"{type(e).__name__}: {e}"}).encode()
    # torch >= 2.15 keeps one recorder per backend, gloo's the default: the first that has
    # entries (NCCL's under one of its names), else gloo's empty one.
    for backend in ("nccl", "nccl-legacy", "nccl2", "xccl"):
        if not _no_entries(body):
            break
        try:
            other = _as_bytes(dump(backend=backend))
        except Exception:  # noqa: BLE001 - an older torch or no such recorder
            continue
        if not _no_entries(other):
            body = other
    return body


def _as_bytes(body):
    return body if isinstance(body, bytes) else str(body).encode()


def _no_entries(body):
    return b'"entries": []' in body or b'"entries":[]' in body


def _flight_recorder_answer(directory, rank):
    path = _os.path.join(directory, f"rank_{rank}.json")
    tmp = f"{path}.tmp.{_os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(_flight_recorder_dump())
        _os.replace(tmp, path)
    except OSError:
        pass  # the attempt's directory is gone: nobody is asking any more


def _flight_recorder_loop(directory, rank):
    request = _os.path.join(directory, "request")
    answered = None
    while True:
        _time.sleep(_FLIGHT_RECORDER_POLL_S)
        try:
            st = _os.stat(request)
        except OSError:
            continue
        if (st.st_ino, st.st_mtime_ns) != answered:  # each request is a new file
            answered = (st.st_ino, st.st_mtime_ns)
            _flight_recorder_answer(directory, rank)


def serve_flight_recorder():
    """Starts the thread that answers ddprun's requests for this process's flight recorder:
    once, in the worker itself (not in a process it forks, such as a DataLoader worker, which
    would answer with a copy); nothing outside ddprun."""
    global _flight_recorder_pid
    directory = _os.environ.get("DDPRUN_FLIGHT_RECORDER")
    rank = _os.environ.get("RANK")
    if not directory or rank is None or _flight_recorder_pid is not None:
        return
    import _thread
    _flight_recorder_pid = _os.getpid()
    _thread.start_new_thread(_flight_recorder_loop, (directory, rank))
