"""The raw format of an in-memory checkpoint (ddprun.checkpoint): how an object whose tensors
are all plain dense tensors is written, and read back."""
import os

# The raw format: what a save of plain tensors is written as (torch.save's is kept for anything
# else). MAGIC, u64 length of the header, the header (a pickle of the object with every tensor
# replaced by its index, and each tensor's dtype, shape and requires_grad), then each tensor's
# bytes, each at a multiple of _ALIGN. Writing it costs one copy of the tensors into the file;
# torch.save pickles on top of that, which for a small state costs more than the copy.
MAGIC = b"DDPRUN-CKPT1\n"
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


def _dense(t):
    """`t` as a contiguous CPU tensor whose memory holds its values as they read (no conjugate
    or negative bit), to copy from its data pointer."""
    if not (t.is_cpu and t.is_contiguous()):
        t = t.to("cpu").contiguous()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


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


def encode(obj):
    """The raw format of `obj`: its head (magic, length, header), its tensors as (offset,
    dense tensor, bytes), and the size of it all; or None when one of its tensors is not a
    plain dense tensor (then torch.save writes it)."""
    import io
    import pickle
    import torch
    buf = io.BytesIO()
    pickler = _pickler(buf)
    try:
        pickler.dump(obj)
    except _NotPlain:
        return None
    meta, dense = [], []
    for t in pickler.tensors:
        meta.append((_dtype_name(t.dtype), tuple(t.shape), t.requires_grad,
                     type(t) is torch.nn.Parameter))
        dense.append(_dense(t))
    header = pickle.dumps((buf.getvalue(), meta), protocol=pickle.HIGHEST_PROTOCOL)
    head = b"".join((MAGIC, len(header).to_bytes(8, "little"), header))
    at, places = len(head), []
    for t in dense:
        at += -at % _ALIGN
        n = t.numel() * t.element_size()
        if n:
            places.append((at, t, n))
        at += n
    return head, places, at


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


def weights_only_default(torch):
    """torch.load's default: weights only from torch 2.6 on."""
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (2, 6)


def decode(f, map_location, weights_only):
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
    at = len(MAGIC)
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
