"""Data: generated deterministically (the same bytes on every rank and every machine), or read
from ``data/`` where each file's SHA-256 is checked on load against ``data/CHECKSUMS``."""

from __future__ import annotations

import csv
import functools
import hashlib
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def teacher_classification(n: int = 4096, d_in: int = 32, classes: int = 10, seed: int = 1234):
    """A classification task labelled by a fixed random 'teacher' network.

    Learnable (a student MLP drives the loss well below log(classes)) and generated from a
    private generator, so it does not disturb any other random stream.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w1 = torch.randn(d_in, 64, generator=g) / d_in**0.5
    w2 = torch.randn(64, classes, generator=g) / 8.0
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


def batch_indices(n: int, global_batch: int, step: int, seed: int) -> torch.Tensor:
    """Indices of the global batch for ``step``: a seeded permutation per pass over the data."""
    per_epoch = max(1, n // global_batch)
    epoch, k = divmod(step, per_epoch)
    return _permutation(n, seed * 100_003 + epoch)[k * global_batch:(k + 1) * global_batch].clone()


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int) -> torch.Tensor:
    # Drawn once per pass, not once per step: chapter 5's 6,144-step runs at B = 64 would draw the
    # same permutation again every step. The caller gets a copy of its slice.
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def forget_permutations() -> None:
    """Drop the cached shuffles (:class:`lesson_lib.peakmem.PeakMemory` does, so that each measured
    run allocates its own, as in a fresh process)."""
    _permutation.cache_clear()


def shard(indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s equal slice of a global batch (the batch must divide evenly)."""
    per = len(indices) // world_size
    return indices[rank * per:(rank + 1) * per]


def checked_path(name: str) -> Path:
    """Path of a shipped data file after verifying its SHA-256 against data/CHECKSUMS."""
    sums = {}
    for line in (DATA_DIR / "CHECKSUMS").read_text().splitlines():
        if line.strip():
            digest, fname = line.split()
            sums[fname] = digest
    path = DATA_DIR / name
    if name not in sums:
        raise FileNotFoundError(f"{name} is not listed in data/CHECKSUMS")
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != sums[name]:
        raise ValueError(f"data/{name} is corrupt or changed: sha256 {actual} != {sums[name]}")
    return path


def read_csv(name: str) -> list[dict]:
    with checked_path(name).open(newline="") as f:
        return list(csv.DictReader(f))


def subspace_teacher(n: int = 8192, d_in: int = 64, rank: int = 8, classes: int = 10,
                     seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """Points near a ``rank``-dimensional subspace of R^d_in, labelled by a random tanh teacher.

    Chapter 5's task: a deep MLP learns it to about 0.8 held-out accuracy in a few epochs at a
    small batch, so the effect of a large batch on the same budget of samples shows in seconds.
    Generated from a private generator, like :func:`teacher_classification`.
    """
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(rank, d_in, generator=g) / rank**0.5
    x = torch.randn(n, rank, generator=g) @ basis + 0.05 * torch.randn(n, d_in, generator=g)
    w1 = 2 * torch.randn(d_in, 64, generator=g) / d_in**0.5
    w2 = torch.randn(64, classes, generator=g) / 8.0
    return x, (torch.tanh(x @ w1) @ w2).argmax(dim=1)
