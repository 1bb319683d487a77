"""ddprun::DistributedSampler yields exactly the indices of Python's DistributedSampler
(/usr/bin/python3's torch), for many (length, world, rank, seed, epoch, shuffle, drop_last)."""
import itertools
import random
import subprocess

from torch.utils.data.distributed import DistributedSampler

from sdkutil import sdk_bin


def cases():
    rng = random.Random(1234)
    out = []
    # Edge cases: empty and tiny datasets, more ranks than samples, uneven splits.
    for size, world in itertools.product([0, 1, 2, 3, 7, 10, 64, 65], [1, 2, 3, 4, 8]):
        for rank in sorted({0, world - 1, world // 2}):
            for shuffle, drop_last in itertools.product([False, True], repeat=2):
                out.append((size, world, rank, 0, 0, shuffle, drop_last))
    # Random sizes, seeds (up to 2**63) and epochs.
    for _ in range(300):
        world = rng.choice([1, 2, 3, 5, 8, 16, 64])
        out.append((rng.randint(0, 5000), world, rng.randrange(world),
                    rng.choice([0, 1, 3, 42, rng.randrange(2**31), rng.randrange(2**63)]),
                    rng.randrange(100), rng.random() < 0.8, rng.random() < 0.5))
    out.append((100_000, 8, 5, 7, 3, True, False))  # one large shuffle
    return out


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def python_indices(size, world, rank, seed, epoch, shuffle, drop_last):
    s = DistributedSampler(_Sized(size), num_replicas=world, rank=rank, shuffle=shuffle,
                           seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    got = list(iter(s))
    assert len(got) == len(s)
    return got


def test_sampler_matches_python():
    all_cases = cases()
    query = "".join(f"{n} {w} {r} {s} {e} {int(sh)} {int(dl)}\n"
                    for n, w, r, s, e, sh, dl in all_cases)
    result = subprocess.run([sdk_bin("sampler_dump")], input=query, capture_output=True,
                            text=True, timeout=120, check=True)
    lines = result.stdout.split("\n")
    assert len(lines) >= len(all_cases)
    for case, line in zip(all_cases, lines):
        cpp = [int(v) for v in line.split()]
        assert cpp == python_indices(*case), f"case {case}"
