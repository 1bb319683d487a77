"""Python twin of object_collectives_worker.cpp: the same object collectives and reduce through
torch.distributed (gloo), written to OUT/rank<R>/ in the same layout."""
import os
import pathlib
import sys

import torch
import torch.distributed as dist


def big_object():
    return bytes((i * 7) % 251 for i in range(1 << 20))


def write_tensor(directory, name, t):
    t = t.contiguous().cpu()
    (directory / f"{name}.shape").write_text(",".join(str(d) for d in t.shape) + "\n")
    (directory / f"{name}.bin").write_bytes(bytes(t.view(torch.uint8).flatten().tolist()))


def main(out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    d = pathlib.Path(out) / f"rank{rank}"
    d.mkdir(parents=True, exist_ok=True)

    strings = [None] * world
    dist.all_gather_object(strings, b"" if rank == 0 else b"rank one, longer")
    for i, s in enumerate(strings):
        (d / f"ag_str_{i}.bin").write_bytes(s)
    dist.all_gather_object(strings, big_object() if rank == 0 else b"x" * 10)
    for i, s in enumerate(strings):
        (d / f"ag_big_{i}.bin").write_bytes(s)

    tensors = [None] * world
    dist.all_gather_object(tensors, torch.arange((rank + 1) * 3, dtype=torch.float64).reshape(rank + 1, 3))
    for i, t in enumerate(tensors):
        write_tensor(d, f"ag_t_{i}", t)

    objects = [b"a", b"", big_object()] if rank == 1 else [None] * 3
    dist.broadcast_object_list(objects, src=1)
    for i, s in enumerate(objects):
        (d / f"bc_{i}.bin").write_bytes(s)

    gathered = [None] * world if rank == 1 else None
    dist.gather_object(b"from zero" if rank == 0 else b"", gathered, dst=1)
    for i, s in enumerate(gathered or []):
        (d / f"g_{i}.bin").write_bytes(s)

    lists = [None] * world if rank == 1 else None
    dist.gather_object([torch.ones(rank + 1), torch.full((2, 2), float(rank))], lists, dst=1)
    for i, ts in enumerate(lists or []):
        for j, t in enumerate(ts):
            write_tensor(d, f"g_t_{i}_{j}", t)

    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
           "product": dist.ReduceOp.PRODUCT}
    for name, op in ops.items():
        t = torch.tensor([rank + 1.5, -(rank + 1) * 2.0, 3.0 ** rank], dtype=torch.float32)
        dist.reduce(t, 0, op)
        if rank == 0:
            write_tensor(d, f"red_{name}", t)
    dist.barrier()
    sys.stdout.flush()
    # Skip interpreter teardown: torch 1.13's gloo group can crash at exit (see ddp_gloo.py).
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
