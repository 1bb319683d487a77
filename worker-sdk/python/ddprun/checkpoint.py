"""In-memory checkpoints: a state saved to memory that outlives the worker process.

ddprun gives every job a directory on a tmpfs, private to the job's user, removed when the job
ends (DDPRUN_MEMORY_CHECKPOINT_DIR, bounded by --memory-checkpoints). save_checkpoint() writes
an object there with torch.save (a memory copy, no disk write), load_checkpoint() reads it back
after a restart. A save costs the caller a copy of the tensors; a thread writes the copy. A save
is atomic: it goes to a temp file that is renamed over the previous one, so a worker killed in
the middle of a save leaves the previous checkpoint, never a torn one (ddprun removes the temp
file before the next attempt).

The directory is per node: on one node every rank sees every save. Where ranks hold the same
state (DDP), let rank 0 save and load and broadcast it; where each holds its own part (a
ZeroRedundancyOptimizer shard), give each rank its own name.
"""
import atexit
import os
import re
import threading

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class CheckpointLimitError(RuntimeError):
    """A save that would pass the job's bound (--memory-checkpoints); nothing was changed."""


def memory_checkpoint_dir():
    """The job's in-memory checkpoint directory, or None (not under ddprun, or turned off)."""
    path = os.environ.get("DDPRUN_MEMORY_CHECKPOINT_DIR")
    return path if path and os.path.isdir(path) else None


def _path(directory, name):
    if not _NAME.fullmatch(name):
        raise ValueError(f"checkpoint name {name!r}: letters, digits, '_', '.', '-' only, "
                         "not starting with '.' or '-'")
    return os.path.join(directory, name + ".pt")


def _limit():
    try:
        return int(os.environ.get("DDPRUN_MEMORY_CHECKPOINT_LIMIT", "0"))
    except ValueError:
        return 0


def _used(directory, besides):
    """Bytes the other checkpoints in the directory hold."""
    total = 0
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False) and entry.path != besides:
            total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


def _tensor_bytes(obj, seen=None):
    """What the tensors in `obj` (dicts, lists, tuples of them) hold: the size of the save,
    give or take its metadata."""
    import torch
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj.storage()
        key = storage.data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def _snapshot(obj):
    """`obj` with every tensor copied to a new CPU tensor (the state as it is now, which the
    next optimizer step will not change); containers rebuilt, other values kept as they are."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        items = [(k, _snapshot(v)) for k, v in obj.items()]
        try:
            return type(obj)(items)
        except TypeError:  # a dict subclass that cannot be built from items
            return dict(items)
    if isinstance(obj, list):
        return [_snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        values = [_snapshot(v) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    return obj


def _write(directory, name, snapshot):
    """torch.save into a temp file, renamed over the previous save: atomic."""
    import torch
    final = _path(directory, name)
    limit = _limit()
    temp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as f:
            torch.save(snapshot, f)
        if limit:
            used = _used(directory, final) - os.stat(temp).st_blocks * 512
            size = os.stat(temp).st_blocks * 512
            if used + size > limit:
                raise CheckpointLimitError(
                    f"in-memory checkpoint {name!r} ({size / 2**20:.0f} MiB) would pass the "
                    f"job's bound of {limit / 2**20:.0f} MiB ({used / 2**20:.0f} MiB in use); "
                    "raise ddprun --memory-checkpoints")
        os.replace(temp, final)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


class _Writer:
    """One thread per process that writes the saves: for each name, the latest snapshot
    (an older one not yet written is dropped: only the last matters). A write's error is raised
    by the next call for that name."""

    def __init__(self):
        self._cond = threading.Condition()
        self._pending = {}  # name -> (directory, snapshot)
        self._busy = set()
        self._errors = {}
        self._thread = None
        self._pid = None

    def submit(self, directory, name, snapshot):
        with self._cond:
            self._raise_error(name)
            if self._pid != os.getpid():  # first use, or a forked child: its own thread
                self._pending, self._busy, self._errors = {}, set(), {}
                self._thread = threading.Thread(target=self._run, name="ddprun-checkpoint",
                                                daemon=True)
                self._pid = os.getpid()
                self._thread.start()
            self._pending[name] = (directory, snapshot)
            self._cond.notify_all()

    def flush(self, name=None):
        """Waits until the saves of `name` (None: all) are written; raises a write's error."""
        with self._cond:
            if self._pid == os.getpid():
                self._cond.wait_for(lambda: not self._busy and not (
                    self._pending if name is None else name in self._pending))
            if name is not None:
                self._raise_error(name)
            elif self._errors:
                self._raise_error(next(iter(self._errors)))

    def _raise_error(self, name):
        error = self._errors.pop(name, None)
        if error is not None:
            raise error

    def _run(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending)
                name, (directory, snapshot) = next(iter(self._pending.items()))
                del self._pending[name]
                self._busy.add(name)
            try:
                _write(directory, name, snapshot)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's next call
                with self._cond:
                    self._errors[name] = e
            finally:
                del snapshot
                with self._cond:
                    self._busy.discard(name)
                    self._cond.notify_all()


_writer = _Writer()
atexit.register(_writer.flush)  # a script that ends normally leaves its last saves written


def save_checkpoint(obj, name="checkpoint", wait=False):
    """Saves `obj` (what torch.save takes: a dict of state_dicts, tensors, numbers) to memory
    under `name`, replacing the previous save of that name atomically. Returns True, or False
    when there is no in-memory checkpoint directory (not under ddprun).

    The call costs a copy of the tensors in memory (the state as of now: the training loop may
    go on changing it); a thread of this process then writes the copy while training goes on.
    `wait=True` returns once it is written (load_checkpoint of the name waits too). Raises
    CheckpointLimitError when the save would pass the job's bound (the previous save of the
    name stays); an error of a write in the background is raised by the next call for the
    name."""
    directory = memory_checkpoint_dir()
    if directory is None:
        return False
    final = _path(directory, name)
    limit = _limit()
    if limit:
        used = _used(directory, final)
        more = _tensor_bytes(obj)
        if used + more > limit:
            raise CheckpointLimitError(
                f"in-memory checkpoint {name!r}: about {more / 2**20:.0f} MiB more would pass "
                f"the job's bound of {limit / 2**20:.0f} MiB ({used / 2**20:.0f} MiB in use); "
                "raise ddprun --memory-checkpoints")
    _writer.submit(directory, name, _snapshot(obj))
    if wait:
        _writer.flush(name)
    return True


def load_checkpoint(name="checkpoint", map_location="cpu", **load_args):
    """The object last saved under `name` in this job's memory, or None when there is none
    (a first start, a node new to the job, not under ddprun). `map_location` and `load_args`
    (weights_only=...) as for torch.load."""
    import torch
    directory = memory_checkpoint_dir()
    if directory is None:
        return None
    _writer.flush(name)  # this process's own save of it, if one is still being written
    try:
        f = open(_path(directory, name), "rb")
    except FileNotFoundError:
        return None
    with f:
        return torch.load(f, map_location=map_location, **load_args)
