"""The shadow virtual-address window and page-granular range allocation.

At start every rank process reserves the same window of virtual addresses (PROT_NONE, no
memory behind it):

    va_base + r * slice_bytes  ...  va_base + (r + 1) * slice_bytes     slice of rank r

Rank r places its own allocations in slice r; a peer that registers one of them maps the
owner's HBM pages at the *same* address in its own copy of the window, so an address means
the same bytes in every rank (shadow virtual addressing). ``bytes`` is one uint8 array over
the whole window: any registered range is a cheap slice of it.
"""
from __future__ import annotations

import bisect
import platform

import numpy as np

from ..._errors import BootstrapError, ConfigError
from .. import _native

PAGE = 2 * 1024 * 1024          # allocation granularity, as for device HBM
PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000


def round_up(n: int, a: int = PAGE) -> int:
    return (n + a - 1) // a * a


# the top of a process's address space: 47 bits on x86-64 (4-level paging; mmap stays below it
# unless asked for more), 48 on the others Linux runs this on (arm64's default)
USER_TOP = 1 << (47 if platform.machine().lower() in ("x86_64", "amd64") else 48)


def _tib(n: int) -> str:
    return f"{n / 2**40:.4g} TiB" if n >= 2**40 else f"{n / 2**30:.4g} GiB"


def check_window(va_base: int, world: int, slice_bytes: int, hbm_size: int) -> None:
    """Raise ConfigError, naming the setting to change, when ``world`` slices of
    ``slice_bytes`` (runtime/memory/_segments.py: slice_bytes_for(hbm_size)) from ``va_base`` do not
    fit below the top of the address space."""
    end = va_base + world * slice_bytes
    if end <= USER_TOP:
        return
    room = USER_TOP - va_base
    most = (room // world // 4) // PAGE * PAGE if room > 0 else 0
    fix = (f"at most {_tib(most)} per rank fits at {world} rank(s): lower --hbm-size (STRATACL_HBM_SIZE)"
           if most >= PAGE else "lower STRATACL_VA_BASE")
    raise ConfigError(f"hbm_size={hbm_size} ({_tib(hbm_size)}): {world} rank(s) need a shared address window of "
                      f"{_tib(world * slice_bytes)} (4 x each rank's HBM) from va_base {va_base:#x}, past the "
                      f"{_tib(USER_TOP)} a process can address; {fix}")


class _WindowBytes:
    """Exposes the window as a numpy array without copying (numpy keeps this object alive)."""

    def __init__(self, base: int, length: int):
        self.__array_interface__ = {"data": (base, False), "shape": (length,), "typestr": "|u1",
                                    "version": 3}


class ShadowWindow:
    """This process's reservation of the job-wide address window."""

    def __init__(self, va_base: int, world: int, slice_bytes: int):
        self.base = va_base
        self.world = world
        self.slice_bytes = slice_bytes
        self.length = world * slice_bytes
        check_window(va_base, world, slice_bytes, slice_bytes // 4)     # a job another launcher started
        try:
            _native.mmap_at(va_base, self.length, PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | _native.MAP_FIXED_NOREPLACE, -1, 0)
        except OSError as e:
            raise BootstrapError(
                f"cannot reserve the shared address window {va_base:#x}+{self.length:#x} ({e.strerror}); "
                f"pick another base with STRATACL_VA_BASE") from None
        self.bytes = np.asarray(_WindowBytes(va_base, self.length))

    def slice_start(self, rank: int) -> int:
        return self.base + rank * self.slice_bytes

    def owner(self, va: int) -> int:
        """The rank whose slice holds ``va``, or -1 outside the window."""
        off = va - self.base
        if off < 0 or off >= self.length:
            return -1
        return off // self.slice_bytes

    def map(self, va: int, size: int, fd: int, offset: int, writable: bool = True) -> None:
        """Map ``size`` bytes of HBM segment ``fd`` at ``offset`` onto ``va``."""
        prot = PROT_READ | (PROT_WRITE if writable else 0)
        _native.mmap_at(va, size, prot, MAP_SHARED | MAP_FIXED, fd, offset)

    def unmap(self, va: int, size: int) -> None:
        """Drop a mapping, putting the reservation back so the address stays ours."""
        _native.mmap_at(va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0)

    def view(self, va: int, nbytes: int) -> np.ndarray:
        off = va - self.base
        return self.bytes[off:off + nbytes]

    def close(self) -> None:
        self.bytes = None  # type: ignore[assignment]
        try:
            _native.munmap_at(self.base, self.length)
        except OSError:
            pass


class RangeAllocator:
    """First-fit allocator of page-aligned ranges in [start, start + length), coalescing on free."""

    def __init__(self, start: int, length: int, granularity: int = PAGE):
        self.start, self.length, self.gran = start, length, granularity
        self._starts = [start]        # free ranges, sorted by start
        self._sizes = [length]
        self.used = 0

    def alloc(self, size: int) -> int | None:
        size = round_up(size, self.gran)
        for i, s in enumerate(self._sizes):
            if s >= size:
                addr = self._starts[i]
                if s == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += size
                    self._sizes[i] -= size
                self.used += size
                return addr
        return None

    def free(self, addr: int, size: int) -> None:
        size = round_up(size, self.gran)
        i = bisect.bisect_left(self._starts, addr)
        self._starts.insert(i, addr)
        self._sizes.insert(i, size)
        if i + 1 < len(self._starts) and addr + size == self._starts[i + 1]:
            self._sizes[i] += self._sizes.pop(i + 1)
            self._starts.pop(i + 1)
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == addr:
            self._sizes[i - 1] += self._sizes.pop(i)
            self._starts.pop(i)
        self.used -= size

    @property
    def largest_free(self) -> int:
        return max(self._sizes, default=0)
