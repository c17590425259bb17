"""DIR/weights.bin: a compiled model's weights laid out for mmap, and how its identity is checked.

Layout: a 64-byte header (magic b"IGNWGHT\\0", u32 WEIGHTS_FORMAT_VERSION, zeros), then each array
at a multiple of ALIGN bytes. Which array is which weight is in the library (modl.py), not here.
The library checks the file cheaply at every open (its size and sample_digest: the SHA-256 of
the size and of SAMPLES chunks spread over the file) and fully on request (the SHA-256 of the
whole file); csrc/native/runtime.c computes both the same way.
"""
from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np

from .modl import WeightsIdentity

MAGIC = b"IGNWGHT\0"
WEIGHTS_FORMAT_VERSION = 1        # = IGNIS_WEIGHTS_FORMAT_VERSION in ignis_model.h
HEADER_BYTES = 64
ALIGN = 64
SAMPLE_CHUNK = 4096
SAMPLES = 256


def sample_offsets(size: int, chunk: int = SAMPLE_CHUNK, samples: int = SAMPLES) -> list[tuple[int, int]]:
    """(offset, length) of the sampled chunks: evenly spread, the first and the last included."""
    if size <= 0:
        return []
    n = min(samples, -(-size // chunk))
    c = min(chunk, size)
    if n == 1:
        return [(0, c)]
    return [(i * (size - c) // (n - 1), c) for i in range(n)]


def sample_digest(data, size: int) -> bytes:
    """SHA-256 of the size (u64, little endian) and the sampled chunks of `data` (bytes-like)."""
    h = hashlib.sha256(struct.pack("<Q", size))
    for off, n in sample_offsets(size):
        h.update(data[off:off + n])
    return h.digest()


class WeightsWriter:
    """Appends arrays to weights.bin (aligned), hashing as it goes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = open(self.path, "wb")
        self._sha = hashlib.sha256()
        self.size = 0
        self._write(MAGIC + struct.pack("<II", WEIGHTS_FORMAT_VERSION, 0))
        self._pad(HEADER_BYTES)

    def _write(self, b) -> None:
        self._f.write(b)
        self._sha.update(b)
        self.size += len(b)

    def _pad(self, to: int) -> None:
        n = -self.size % to
        if n:
            self._write(b"\0" * n)

    def add(self, array: np.ndarray) -> tuple[int, int]:
        """Write one array (its bytes as they are in memory, C order); returns (offset, bytes)."""
        self._pad(ALIGN)
        at = self.size
        a = np.ascontiguousarray(array)
        mv = memoryview(a.reshape(-1).view(np.uint8))
        step = 64 << 20        # bounded pieces: a widened f32 copy is never made twice
        for s in range(0, len(mv), step):
            self._write(mv[s:s + step])
        return at, a.nbytes

    def close(self) -> WeightsIdentity:
        self._pad(ALIGN)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        with open(self.path, "rb") as f:
            import mmap
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                digest = sample_digest(m, self.size)
        return WeightsIdentity(self.size, SAMPLE_CHUNK, SAMPLES, self._sha.digest(), digest)
