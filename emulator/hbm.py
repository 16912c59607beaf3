"""Every chip's HBM, with data written to all chips stored once and shared copy-on-write.

A model's weights are the same on every chip, and they are most of HBM: eight full
copies of them cost eight times the memory and the copying. Here data written to
every chip before the chips' memories are first used (`write_all`) goes into one
backing file (anonymous, in memory where the OS allows); each chip then maps that
file privately, so all chips read the same physical pages until one of them writes
a page, which the OS then copies for that chip alone. Pages no chip touches cost
nothing. Reads of bytes a chip has never written go through one shared read-only
mapping (`for_read`), so a page eight chips read is in memory once, not eight
times. After the first use, `write_all` simply writes every chip's copy. A single chip
shares with no one: its HBM is plain anonymous memory, which the OS may back with huge
pages (a shared file's pages are small where shmem huge pages are off, and a DMA that
reads a column block of a large matrix then misses the TLB on every row).

A timing-only run keeps data only in a few buffers (`regions`: the i32 ones), so its
HBM is those buffers alone, one small array each per chip, and a chip of any size
(k3-full's hundred gigabytes) costs only their bytes. Accessors therefore return the
array together with the address of its first byte.
"""

from __future__ import annotations

import bisect
import mmap
import os
import tempfile

import numpy as np

from mkemu.emulator.memory import anonymous, host_mmap


class ChipMemories:
    def __init__(self, chips: int, size_bytes: int, regions: list[tuple[int, int]] | None = None):
        self.chips = chips
        self.size_bytes = size_bytes
        self._arrays: list[np.ndarray] | None = None
        self._shared: np.ndarray | None = None
        # Per chip, the byte ranges it has written (sorted, disjoint [lo, hi) pairs).
        self._written: list[tuple[list[int], list[int]]] = [([], []) for _ in range(chips)]
        self._file = None
        self._fd = -1
        # Timing-only: only these [lo, hi) ranges hold bytes, one array per chip each.
        self._regions = sorted(regions) if regions is not None else None
        if self._regions is not None:
            self._region_lo = [lo for lo, _ in self._regions]
            self._region_arrays = [[np.zeros(hi - lo, np.uint8) for lo, hi in self._regions]
                                   for _ in range(chips)]
        elif size_bytes and chips > 1:
            if hasattr(os, "memfd_create"):
                self._fd = os.memfd_create("mkemu-hbm")
            else:
                self._file = tempfile.TemporaryFile()
                self._fd = self._file.fileno()
            os.ftruncate(self._fd, size_bytes)

    @property
    def arrays(self) -> list[np.ndarray]:
        """One writable uint8 array of `size_bytes` per chip (mapped at first use)."""
        if self._regions is not None:
            raise ValueError("a timing-only HBM holds only its data buffers")
        if self._arrays is None:
            self._map()
        return self._arrays

    def _region(self, chip: int, lo: int, hi: int) -> tuple[np.ndarray | None, int]:
        i = bisect.bisect_right(self._region_lo, lo) - 1
        if i >= 0 and hi <= self._regions[i][1]:
            return self._region_arrays[chip][i], self._regions[i][0]
        return None, 0

    def for_read(self, chip: int, lo: int, hi: int) -> tuple[np.ndarray | None, int]:
        """(array, address of its first byte) holding chip `chip`'s bytes [lo, hi): the
        shared mapping unless the chip has written some of them. In a timing-only HBM,
        (None, 0) where [lo, hi) is not inside one data buffer."""
        if self._regions is not None:
            return self._region(chip, lo, hi)
        arrays = self.arrays
        if self._shared is None:
            return arrays[chip], 0
        los, his = self._written[chip]
        i = bisect.bisect_right(los, lo) - 1
        if (i >= 0 and his[i] > lo) or (i + 1 < len(los) and los[i + 1] < hi):
            return arrays[chip], 0
        return self._shared, 0

    def unchanging(self, array: np.ndarray) -> bool:
        """Is `array` (from `for_read`) the shared mapping, whose bytes never change once
        mapped (every later write goes to a chip's own copy)?"""
        return array is self._shared

    def for_write(self, chip: int, lo: int, hi: int) -> tuple[np.ndarray | None, int]:
        """(array, address of its first byte) of chip `chip`'s own bytes, noting that it
        writes [lo, hi) (timing-only: as `for_read`)."""
        if self._regions is not None:
            return self._region(chip, lo, hi)
        arrays = self.arrays
        los, his = self._written[chip]
        i = bisect.bisect_left(his, lo)        # first range ending at or after lo
        j = bisect.bisect_right(los, hi)       # ranges from i to j - 1 touch [lo, hi]
        if i < j:
            lo, hi = min(lo, los[i]), max(hi, his[j - 1])
        los[i:j] = [lo]
        his[i:j] = [hi]
        return arrays[chip], 0

    def write_all(self, offset: int, data: np.ndarray) -> None:
        """Write the same bytes at `offset` of every chip's HBM."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if self._arrays is not None or self._regions is not None or self.chips == 1:
            for chip in range(self.chips):
                array, base = self.for_write(chip, offset, offset + raw.size)
                if array is not None:
                    array[offset - base:offset - base + raw.size] = raw
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
            self._shared = np.zeros(0, np.uint8)
            return
        if self.chips == 1:         # nothing to share
            self._arrays = [anonymous(self.size_bytes)]
            return
        maps = [host_mmap(self._fd, self.size_bytes, access=mmap.ACCESS_COPY) for _ in range(self.chips)]
        self._arrays = [np.frombuffer(m, np.uint8) for m in maps]
        self._shared = np.frombuffer(host_mmap(self._fd, self.size_bytes, access=mmap.ACCESS_READ), np.uint8)
        # The mappings keep the file's pages; the descriptor is no longer needed.
        if self._file is not None:
            self._file.close()
        else:
            os.close(self._fd)
        self._fd = -1

