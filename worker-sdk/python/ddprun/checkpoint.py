"""In-memory checkpoints: a state saved to memory that outlives the worker process.

ddprun gives every job a directory on a tmpfs, private to the job's user, removed when the job
ends (DDPRUN_MEMORY_CHECKPOINT_DIR, bounded by --memory-checkpoints). save_checkpoint() writes
an object there (a memory copy, no disk write), load_checkpoint() reads it back after a restart.
A save costs the caller one copy of the tensors and is written when the call returns. A save
is atomic: it goes to a temp file that is renamed over the previous one, so a worker killed in
the middle of a save leaves the previous checkpoint, never a torn one (ddprun removes the temp
file before the next attempt).

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


# The raw format: what a save of plain tensors is written as (torch.save's is kept for anything
# else). MAGIC, u64 length of the header, the header (a pickle of the object with every tensor
# replaced by its index, and each tensor's dtype, shape and requires_grad), then each tensor's
# bytes, each at a multiple of _ALIGN. Writing it costs one copy of the tensors into the file;
# torch.save pickles on top of that, which for a small state costs more than the copy.
_MAGIC = b"DDPRUN-CKPT1\n"
_ALIGN = 64


class _NotPlain(Exception):
    pass


def _raw_parts(obj):
    """The raw format's parts for `obj` (bytes-like objects to write in order), or None when one
    of its tensors is not a plain dense tensor (then torch.save writes it)."""
    import io
    import pickle
    import torch
    tensors, index = [], {}

    def persistent_id(o):
        if not isinstance(o, torch.Tensor):
            return None
        if (type(o) not in (torch.Tensor, torch.nn.Parameter) or o.layout != torch.strided
                or o.is_quantized):
            raise _NotPlain()
        if id(o) not in index:
            index[id(o)] = len(tensors)
            tensors.append(o)
        return index[id(o)]

    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.persistent_id = persistent_id
    try:
        pickler.dump(obj)
    except _NotPlain:
        return None
    meta, datas = [], []
    for t in tensors:
        meta.append((str(t.dtype).split(".")[-1], tuple(t.shape), t.requires_grad,
                     type(t) is torch.nn.Parameter))
        t = t.detach().to("cpu").contiguous().reshape(-1)
        datas.append(t.view(torch.uint8).numpy() if t.numel() else b"")
    header = pickle.dumps((buf.getvalue(), meta), protocol=pickle.HIGHEST_PROTOCOL)
    parts = [_MAGIC, len(header).to_bytes(8, "little"), header]
    at = len(_MAGIC) + 8 + len(header)
    for data in datas:
        pad = -at % _ALIGN
        parts += [bytes(pad), data]
        at += pad + len(data)
    return parts


def _write(directory, name, obj):
    """Writes `obj` into a temp file, renamed over the previous save: atomic."""
    import torch
    final = _path(directory, name)
    limit = _limit()
    temp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        parts = _raw_parts(obj)
        with open(temp, "wb", buffering=0 if parts is not None else -1) as f:
            if parts is None:
                torch.save(obj, f)
            else:
                for part in parts:
                    view = memoryview(part)
                    while view.nbytes:
                        view = view[f.write(view):]
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
    _write(directory, name, obj)
    return True


class _WeightsOnly:
    """Unpickles only containers and plain values (what torch.load's weights_only allows of
    a state dict's structure): a checkpoint cannot run code."""

    ALLOWED = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
               ("builtins", "complex"), ("builtins", "slice"), ("builtins", "range")}

    @classmethod
    def unpickler(cls, file):
        import pickle

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
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
    unpickler = (_WeightsOnly.unpickler(io.BytesIO(skeleton)) if weights_only
                 else pickle.Unpickler(io.BytesIO(skeleton)))
    unpickler.persistent_load = lambda i: tensors[i]
    return unpickler.load()


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
