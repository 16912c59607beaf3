"""Every chip's HBM, with data written to all chips stored once and shared copy-on-write.

A model's weights are the same on every chip, and they are most of HBM: eight full
copies of them cost eight times the memory and the copying. Here data written to
every chip before the chips' memories are first used (`write_all`) goes into one
backing file (anonymous, in memory where the OS allows); each chip then maps that
file privately, so all chips read the same physical pages until one of them writes
a page, which the OS then copies for that chip alone. Pages no chip touches cost
nothing. After the first use, `write_all` simply writes every chip's copy.
"""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np


class ChipMemories:
    def __init__(self, chips: int, size_bytes: int):
        self.chips = chips
        self.size_bytes = size_bytes
        self._arrays: list[np.ndarray] | None = None
        self._file = None
        self._fd = -1
        if size_bytes:
            if hasattr(os, "memfd_create"):
                self._fd = os.memfd_create("mkemu-hbm")
            else:
                self._file = tempfile.TemporaryFile()
                self._fd = self._file.fileno()
            os.ftruncate(self._fd, size_bytes)

    @property
    def arrays(self) -> list[np.ndarray]:
        """One writable uint8 array of `size_bytes` per chip (mapped at first use)."""
        if self._arrays is None:
            self._map()
        return self._arrays

    def write_all(self, offset: int, data: np.ndarray) -> None:
        """Write the same bytes at `offset` of every chip's HBM."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if self._arrays is not None:
            for array in self._arrays:
                array[offset:offset + raw.size] = raw
            return
        view = memoryview(raw)
        done = 0
        while done < raw.size:
            if hasattr(os, "pwrite"):
                done += os.pwrite(self._fd, view[done:], offset + done)
            else:
                os.lseek(self._fd, offset + done, os.SEEK_SET)
                done += os.write(self._fd, view[done:])

    def _map(self) -> None:
        if not self.size_bytes:
            self._arrays = [np.zeros(0, np.uint8) for _ in range(self.chips)]
            return
        maps = [mmap.mmap(self._fd, self.size_bytes, access=mmap.ACCESS_COPY) for _ in range(self.chips)]
        self._arrays = [np.frombuffer(m, np.uint8) for m in maps]
        # The mappings keep the file's pages; the descriptor is no longer needed.
        if self._file is not None:
            self._file.close()
        else:
            os.close(self._fd)
        self._fd = -1
