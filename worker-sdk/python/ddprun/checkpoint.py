"""In-memory checkpoints: a state saved to memory that outlives the worker process.

ddprun gives every job a directory on a tmpfs, private to the job's user, removed when the job
ends (DDPRUN_MEMORY_CHECKPOINT_DIR, bounded by --memory-checkpoints). save_checkpoint() writes
an object there (a memory copy, no disk write), load_checkpoint() reads it back after a restart.
A save costs the caller one copy of the tensors and is written when the call returns. A save
is atomic: it goes to a temp file that takes the previous one's place in one rename, so a worker
killed in the middle of a save leaves the previous checkpoint, never a torn one (ddprun removes
the temp file before the next attempt).

Saving every step should cost little more than the copy. A new file's memory pages cost more to
get than the copy into them, so the rename is an exchange (renameat2's RENAME_EXCHANGE): the
previous save becomes the temp file, and the next save writes over its pages. The agent sends
saves to another node while the workers run; it holds a shared flock on a file while it reads
it, and a save takes an exclusive one (without waiting) on the temp file before writing into
it: a file being read is never written, the save gets a new file instead. Where keeping the
previous save would pass the job's bound, or the kernel cannot exchange, a save makes a new
file each time and the previous one is freed. The process keeps both files open and mapped
between saves (checking that the temp file is still the one it left), so a save that is no
larger than the one it writes over is a lock, a copy into mapped pages (no page-by-page lookup
as a write() makes), a rename and an unlock, with no look at the bound. A file that changes
size gets its pages first (fallocate): a full tmpfs fails the save, never the process.

The directory is per node: on one node every rank sees every save. Where ranks hold the same
state (DDP), let rank 0 save and load and broadcast it; where each holds its own part (a
ZeroRedundancyOptimizer shard), give each rank its own name.
"""
import os
import re

from . import _raw_format

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
    """Bytes the files in the directory hold, but for the paths in `besides`."""
    total = 0
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False) and entry.path not in besides:
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


_rename2 = None  # libc's renameat2, False where there is none


def _exchange(temp, final):
    """Swaps the two names in one step (renameat2's RENAME_EXCHANGE). False, with nothing
    changed, where `final` does not exist yet or this kernel or file system cannot swap."""
    import ctypes
    import errno
    global _rename2
    if _rename2 is None:
        try:
            _rename2 = ctypes.CDLL(None, use_errno=True).renameat2
            _rename2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                 ctypes.c_uint]
        except (OSError, AttributeError):
            _rename2 = False
    if not _rename2:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if _rename2(at_fdcwd, os.fsencode(temp), at_fdcwd, os.fsencode(final), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        _rename2 = False
    elif err != errno.ENOENT:
        raise OSError(err, os.strerror(err), final)
    return False


def _open_temp(temp):
    """The temp file, locked: a file an earlier process left there to write over, or a new
    one where there is none or the agent is reading it (sending it to another node)."""
    import fcntl
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return _Held(fd)
    except BlockingIOError:
        os.close(fd)
    os.unlink(temp)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return _Held(fd)


def _blocks(path):
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _over_bound(name, size, used, limit, about=""):
    return CheckpointLimitError(
        f"in-memory checkpoint {name!r} ({about}{size / 2**20:.0f} MiB) would pass the job's "
        f"bound of {limit / 2**20:.0f} MiB ({used / 2**20:.0f} MiB in use); "
        "raise ddprun --memory-checkpoints")


class _Held:
    """A file of a name's saves that this process holds open between saves, and maps once a
    raw save is copied into it. `size`: its length, None where this process has not written
    it (an earlier process's file: the bound is looked at before it is used)."""
    __slots__ = ("fd", "inode", "size", "map", "base")

    def __init__(self, fd):
        self.fd, self.inode = fd, os.fstat(fd).st_ino
        self.size, self.map, self.base = None, None, 0

    def unmap(self):
        if self.map is not None:
            self.map.close()
            self.map, self.base = None, 0

    def close(self):
        self.unmap()
        os.close(self.fd)

    def copy_in(self, raw, name):
        """Copies a raw save into the file, first giving it the save's length, its memory
        pages got (so a full tmpfs is an error here, not a SIGBUS in the copy), and mapping it
        where it is not mapped at that length already."""
        import ctypes
        import mmap
        head, places, size = raw
        if self.map is None or self.size != size:
            self.unmap()
            os.ftruncate(self.fd, size)
            self.size = size
            try:
                os.posix_fallocate(self.fd, 0, size)
            except OSError as e:
                raise OSError(e.errno, f"in-memory checkpoint {name!r}: no memory for this save "
                              f"({size / 2**20:.0f} MiB): {e.strerror}") from None
            self.map = mmap.mmap(self.fd, size)
            self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.map[:len(head)] = head
        memmove, base = ctypes.memmove, self.base
        for at, t, n in places:
            memmove(base + at, t.data_ptr(), n)


class _Files:
    """The files of one name's saves that this process holds: the one in place (`current`)
    and the previous one, which the last rename swapped out to the temp path (`spare`). With
    both known, a save no larger than the spare is: lock it, copy into its mapped pages, swap
    it in, unlock it; the bound is only looked at when a save is larger than the file it
    writes over."""
    __slots__ = ("pid", "final", "temp", "current", "spare")

    def __init__(self, directory, name):
        self.pid = os.getpid()
        self.final = _path(directory, name)
        self.temp = os.path.join(directory, f".{name}.{self.pid}.tmp")
        self.current = self.spare = None

    def take_spare(self):
        """The spare, locked, where it is still the file at the temp path and the agent is not
        reading it; else it is let go and the temp path opened."""
        import fcntl
        spare, self.spare = self.spare, None
        if spare is not None:
            try:
                if os.stat(self.temp).st_ino == spare.inode:
                    fcntl.flock(spare.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return spare
            except (FileNotFoundError, BlockingIOError):
                pass
            spare.close()
        return _open_temp(self.temp)


_FILES = {}


def _files(directory, name):
    files = _FILES.get((directory, name))
    if files is None or files.pid != os.getpid():  # new, or inherited through a fork
        for held in (files.current, files.spare) if files is not None else ():
            if held is not None:
                held.close()
        files = _FILES[(directory, name)] = _Files(directory, name)
    return files


def _write(directory, name, obj):
    """Writes `obj` into the temp file, which then takes the previous save's place: atomic."""
    import fcntl
    import torch
    files = _files(directory, name)
    limit = _limit()
    raw = _raw_format.encode(obj)
    spare = files.take_spare()
    grows = raw is None or spare.size is None or raw[2] > spare.size
    check = limit and grows
    used = _used(directory, (files.final, files.temp)) if check else 0
    try:
        if check:  # refused before a byte is written
            more = raw[2] if raw is not None else _tensor_bytes(obj)
            if used + more > limit:
                raise _over_bound(name, more, used, limit, "" if raw is not None else "about ")
        if raw is None:
            spare.unmap()
            with os.fdopen(spare.fd, "wb", closefd=False) as f:
                f.seek(0)  # from the start: an earlier torch.save into this file moved the offset
                torch.save(obj, f)
                size = f.tell()
            if size != spare.size:
                os.ftruncate(spare.fd, size)  # what is left of a longer previous save
            spare.size = size
        else:
            spare.copy_in(raw, name)
        if check:
            blocks = os.fstat(spare.fd).st_blocks * 512
            if used + blocks > limit:
                raise _over_bound(name, blocks, used, limit)
        swapped = _exchange(files.temp, files.final)
        if not swapped:
            os.replace(files.temp, files.final)
    except BaseException:
        spare.close()
        try:
            os.unlink(files.temp)
        except OSError:
            pass
        raise
    fcntl.flock(spare.fd, fcntl.LOCK_UN)  # in place now: the agent may read it
    previous, files.current = files.current, spare
    if swapped and check and used + blocks + _blocks(files.temp) > limit:
        os.unlink(files.temp)  # no room to keep the previous save for the next one to write over
        swapped = False
    if swapped:
        files.spare = previous  # None where the file in place was not this process's
    elif previous is not None:
        previous.close()  # the file that was in place, if it was ours, is gone


def save_checkpoint(obj, name="checkpoint", wait=False):
    """Saves `obj` (what torch.save takes: a dict of state_dicts, tensors, numbers) to memory
    under `name`, replacing the previous save of that name atomically. Returns True, or False
    when there is no in-memory checkpoint directory (not under ddprun).

    The save is written when the call returns (`wait` is accepted for scripts written for the
    earlier background writer; it changes nothing). Its cost is a copy of the tensors into
    memory: plain dense tensors are written as they are, anything else with torch.save. Raises
    CheckpointLimitError when the save would pass the job's bound (the previous save of the
    name stays)."""
    directory = memory_checkpoint_dir()
    if directory is None:
        return False
    _write(directory, name, obj)
    return True


def load_checkpoint(name="checkpoint", map_location="cpu", **load_args):
    """The object last saved under `name` in this job's memory, or None when there is none
    (a first start, a node new to the job, not under ddprun). `map_location` and `load_args`
    (weights_only=...) as for torch.load; what plain tensors were saved as takes a device, a
    device name or {'cpu': device} as map_location, and `weights_only` as torch.load's
    default (True from torch 2.6)."""
    import torch
    directory = memory_checkpoint_dir()
    if directory is None:
        return None
    try:
        f = open(_path(directory, name), "rb", buffering=0)
    except FileNotFoundError:
        return None
    with f:
        if f.read(len(_raw_format.MAGIC)) == _raw_format.MAGIC:
            weights_only = load_args.get("weights_only")
            if weights_only is None:
                weights_only = _raw_format.weights_only_default(torch)
            return _raw_format.decode(f, map_location, weights_only)
        f.seek(0)
        return torch.load(f, map_location=map_location, **load_args)
