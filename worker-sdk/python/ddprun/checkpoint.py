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
file each time and the previous one is freed. The process keeps both files open between saves
(checking that the temp file is still the one it left), so a save that is no larger than the
one it writes over costs four system calls and no look at the bound.

The directory is per node: on one node every rank sees every save. Where ranks hold the same
state (DDP), let rank 0 save and load and broadcast it; where each holds its own part (a
ZeroRedundancyOptimizer shard), give each rank its own name.
"""
import os
import re

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


# The raw format: what a save of plain tensors is written as (torch.save's is kept for anything
# else). MAGIC, u64 length of the header, the header (a pickle of the object with every tensor
# replaced by its index, and each tensor's dtype, shape and requires_grad), then each tensor's
# bytes, each at a multiple of _ALIGN. Writing it costs one copy of the tensors into the file;
# torch.save pickles on top of that, which for a small state costs more than the copy.
_MAGIC = b"DDPRUN-CKPT1\n"
_ALIGN = 64


class _NotPlain(Exception):
    pass


def _tensor_at(index):
    """What stands for a tensor in a raw save's skeleton; the loader maps it to the tensor."""
    raise RuntimeError("a ddprun in-memory checkpoint is read by ddprun.load_checkpoint()")


_DTYPE_NAMES = {}


def _dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).split(".")[-1]
    return name


def _tensor_bytes_view(t):
    """`t`'s bytes in memory order, as an object that the buffer protocol writes as they are."""
    import torch
    if t.requires_grad:
        t = t.detach()
    if not (t.is_cpu and t.is_contiguous()):
        t = t.to("cpu").contiguous()
    if not t.numel():
        return b""
    try:
        return t.numpy()
    except (TypeError, RuntimeError):  # no numpy dtype (bfloat16, ...), conjugate bit
        return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy()


_pickler_class = None


def _pickler(buf):
    """A pickler that writes each plain dense tensor as a reference to its place in the save
    (its `tensors` list), and raises _NotPlain at any other tensor."""
    import pickle
    import torch
    global _pickler_class
    if _pickler_class is None:
        plain = (torch.Tensor, torch.nn.Parameter)

        class Pickler(pickle.Pickler):
            # Called for objects other than plain containers and values: far fewer calls than
            # persistent_id, which pickle makes for every object.
            def reducer_override(self, o):
                if not isinstance(o, torch.Tensor):
                    return NotImplemented
                if type(o) not in plain or o.layout != torch.strided or o.is_quantized:
                    raise _NotPlain()
                i = self.index.get(id(o))
                if i is None:
                    i = self.index[id(o)] = len(self.tensors)
                    self.tensors.append(o)
                return _tensor_at, (i,)
        _pickler_class = Pickler
    pickler = _pickler_class(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.tensors, pickler.index = [], {}
    return pickler


def _raw_parts(obj):
    """The raw format's parts for `obj` (bytes-like objects to write in order) and their size,
    or None when one of its tensors is not a plain dense tensor (then torch.save writes it)."""
    import io
    import pickle
    import torch
    buf = io.BytesIO()
    pickler = _pickler(buf)
    try:
        pickler.dump(obj)
    except _NotPlain:
        return None
    meta, datas = [], []
    for t in pickler.tensors:
        meta.append((_dtype_name(t.dtype), tuple(t.shape), t.requires_grad,
                     type(t) is torch.nn.Parameter))
        datas.append(_tensor_bytes_view(t))
    header = pickle.dumps((buf.getvalue(), meta), protocol=pickle.HIGHEST_PROTOCOL)
    parts = [_MAGIC, len(header).to_bytes(8, "little"), header]
    at = len(_MAGIC) + 8 + len(header)
    for data in datas:
        pad = -at % _ALIGN
        if pad:
            parts.append(bytes(pad))
        parts.append(data)
        at += pad + memoryview(data).nbytes
    return parts, at


_IOV_MAX = 1024
_rename2 = None  # libc's renameat2, False where there is none


def _write_all(fd, parts):
    """Writes `parts` one after another from the start of `fd`; returns the bytes written."""
    at = 0
    for first in range(0, len(parts), _IOV_MAX):
        group = [memoryview(p).cast("B") for p in parts[first:first + _IOV_MAX]]
        size = sum(v.nbytes for v in group)
        done = os.pwritev(fd, group, at)
        while done < size:  # a short write: the rest piece by piece
            skip = done
            for v in group:
                if skip >= v.nbytes:
                    skip -= v.nbytes
                    continue
                done += os.pwrite(fd, v[skip:], at + done)
                break
        at += size
    return at


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
    """The temp file, locked: the previous save's pages to write over, or a new file where
    there is none or the agent is reading it (sending it to another node)."""
    import fcntl
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
    os.unlink(temp)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


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


class _Files:
    """The files of one name's saves that this process holds open between saves: the one in
    place (`current`) and the previous one, which the last rename swapped out to the temp path
    (`spare`), each as (fd, bytes written, inode). With both known, a save is four system
    calls (lock the spare, write it, swap it in, unlock it), and the bound is only looked at
    when a save is larger than the file it writes over."""
    __slots__ = ("pid", "final", "temp", "current", "spare")

    def __init__(self, directory, name):
        self.pid = os.getpid()
        self.final = _path(directory, name)
        self.temp = os.path.join(directory, f".{name}.{self.pid}.tmp")
        self.current = self.spare = None

    def take_spare(self):
        """The spare, locked, or None where there is none, it is not at the temp path any
        more, or the agent is reading it (then it is let go: the save makes a new file)."""
        import fcntl
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        try:
            if os.stat(self.temp).st_ino == spare[2]:
                fcntl.flock(spare[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
                return spare
        except (FileNotFoundError, BlockingIOError):
            pass
        os.close(spare[0])
        return None


_FILES = {}


def _files(directory, name):
    files = _FILES.get((directory, name))
    if files is None or files.pid != os.getpid():  # new, or inherited through a fork
        for held in (files.current, files.spare) if files is not None else ():
            if held is not None:
                os.close(held[0])
        files = _FILES[(directory, name)] = _Files(directory, name)
    return files


def _write(directory, name, obj):
    """Writes `obj` into the temp file, which then takes the previous save's place: atomic."""
    import fcntl
    import torch
    files = _files(directory, name)
    limit = _limit()
    raw = _raw_parts(obj)
    spare = files.take_spare()
    if spare is None:
        fd = _open_temp(files.temp)
        spare = (fd, None, os.fstat(fd).st_ino)
    fd, before, _ = spare
    grows = raw is None or before is None or raw[1] > before
    used = _used(directory, (files.final, files.temp)) if limit and grows else 0
    try:
        if limit and grows:  # refused before a byte is written
            more = raw[1] if raw is not None else _tensor_bytes(obj)
            if used + more > limit:
                raise _over_bound(name, more, used, limit, "" if raw is not None else "about ")
        if raw is None:
            with os.fdopen(fd, "wb", closefd=False) as f:
                torch.save(obj, f)
                size = f.tell()
        else:
            size = _write_all(fd, raw[0])
        if size != before:
            os.ftruncate(fd, size)  # what is left of a longer previous save
        if limit and grows:
            blocks = os.fstat(fd).st_blocks * 512
            if used + blocks > limit:
                raise _over_bound(name, blocks, used, limit)
        swapped = _exchange(files.temp, files.final)
        if not swapped:
            os.replace(files.temp, files.final)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(files.temp)
        except OSError:
            pass
        raise
    fcntl.flock(fd, fcntl.LOCK_UN)  # in place now: the agent may read it
    previous, files.current = files.current, (fd, size, spare[2])
    if not swapped:  # the file that was in place, if it was ours, is gone
        if previous is not None:
            os.close(previous[0])
    elif limit and grows and used + blocks + _blocks(files.temp) > limit:
        os.unlink(files.temp)  # no room to keep the previous save for the next one to write over
        if previous is not None:
            os.close(previous[0])
    else:
        files.spare = previous  # None where the file in place was not this process's


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


class _WeightsOnly:
    """Unpickles only containers and plain values (what torch.load's weights_only allows of
    a state dict's structure): a checkpoint cannot run code."""

    ALLOWED = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
               ("builtins", "complex"), ("builtins", "slice"), ("builtins", "range")}

    @classmethod
    def unpickler(cls, file, tensors=()):
        import pickle

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if (module, name) == (__name__, "_tensor_at"):
                    return tensors.__getitem__
                if (module, name) in cls.ALLOWED:
                    return super().find_class(module, name)
                raise pickle.UnpicklingError(
                    f"weights_only load of a checkpoint holding {module}.{name}; pass "
                    "weights_only=False if it comes from a source you trust")
        return Unpickler(file)


def _weights_only_default(torch):
    """torch.load's default: weights only from torch 2.6 on."""
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (2, 6)


def _load_raw(f, map_location, weights_only):
    import io
    import pickle
    import torch
    f.seek(0)
    data = bytearray(os.fstat(f.fileno()).st_size)
    view = memoryview(data)
    got = 0
    while got < len(data):
        n = f.readinto(view[got:])
        if not n:
            raise EOFError(f"in-memory checkpoint {f.name}: {got} of {len(data)} bytes")
        got += n
    at = len(_MAGIC)
    size = int.from_bytes(data[at:at + 8], "little")
    at += 8
    if weights_only:
        skeleton, meta = _WeightsOnly.unpickler(io.BytesIO(data[at:at + size])).load()
    else:
        skeleton, meta = pickle.loads(data[at:at + size])
    at += size
    device = map_location
    if isinstance(map_location, dict):
        device = map_location.get("cpu", "cpu")
    if device is not None and not isinstance(device, (str, torch.device)):
        raise TypeError("load_checkpoint: map_location must be a device, a device name or a "
                        "{'cpu': device} dict for this checkpoint")
    tensors = []
    for dtype_name, shape, requires_grad, parameter in meta:
        dtype = getattr(torch, dtype_name)
        count = 1
        for dim in shape:
            count *= dim
        at += -at % _ALIGN
        t = (torch.frombuffer(data, dtype=dtype, count=count, offset=at) if count
             else torch.empty(0, dtype=dtype))
        at += t.numel() * t.element_size()
        t = t.view(shape)
        if device is not None and torch.device(device).type != "cpu":
            t = t.to(device)
        tensors.append(torch.nn.Parameter(t, requires_grad) if parameter
                       else t.requires_grad_() if requires_grad else t)
    if weights_only:
        return _WeightsOnly.unpickler(io.BytesIO(skeleton), tensors).load()

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == (__name__, "_tensor_at"):
                return tensors.__getitem__
            return super().find_class(module, name)
    return Unpickler(io.BytesIO(skeleton)).load()


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
        if f.read(len(_MAGIC)) == _MAGIC:
            weights_only = load_args.get("weights_only")
            if weights_only is None:
                weights_only = _weights_only_default(torch)
            return _load_raw(f, map_location, weights_only)
        f.seek(0)
        return torch.load(f, map_location=map_location, **load_args)
