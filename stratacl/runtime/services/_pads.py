"""Signal pads' words and the one way a 64-bit word of HBM is updated (``update_word``), used by
the rank that updates a word of its own host (runtime/_onesided.py) and by a host's carrier
for a rank of another host (runtime/hosts/_carrier.py): the same code, on the owner's host.

A signal pad is n u64 signal words followed by more rows of n u64 (``PAD_ROWS``): a change
counter whose low 32 bits are the futex word waiters sleep on, the number of waiters asleep
(a wake is skipped when it is 0), the last signaller's world rank + 1 (for a timeout's
message), and an arrival log: for each of the last ``LOG_ENTRIES`` values the word took, that
value + 1 and the modeled time the update that made it arrives at (entry ``value %
LOG_ENTRIES``). An updater stores the signaller, logs the new value, swaps it in, bumps the
counter, then reads the waiters; a waiter counts itself, then sleeps only while the counter is
unchanged: whichever comes first, no wake-up is lost, and a waiter that sees a value finds
its arrival.
"""
from __future__ import annotations

from .. import _native

# a signal pad's rows of n u64 words: the signals, then their bookkeeping
PAD_SIGNAL, PAD_SEQ, PAD_WAITERS, PAD_LAST, PAD_LOG = range(5)
LOG_ENTRIES = 32            # values whose arrival a signal word remembers (a fan-in of up to 32 is exact)
PAD_ROWS = PAD_LOG + 2 * LOG_ENTRIES
MASK64 = (1 << 64) - 1
# what an update does to the word (its code travels between carriers: runtime/hosts/_carrier.py)
UPDATES = ("fetch_add", "compare_swap", "fetch", "set")


def update_word(addr: int, stride: int, kind: str, a: int, b: int, arrival: int | None, signaller: int) -> int:
    """Update the u64 word at ``addr`` atomically and return the value it held: ``fetch_add``
    a, ``compare_swap`` (if it holds a, store b), ``fetch`` (no change), ``set`` a. A word of a
    signal pad (``stride``: the pad's row stride in bytes; 0 for a plain word) is updated as a
    signal: ``signaller`` (world rank) noted, the new value logged with ``arrival`` (the bits of
    its modeled arrival time; None: no clock), its change counted and its waiters woken; a
    compare_swap that does not swap changes nothing. Every store made before is visible first
    (a full fence)."""
    _native.fence()
    if kind == "fetch" or not stride:
        if kind == "fetch_add":
            return int(_native.fetch_add_u64(addr, a & MASK64))
        if kind == "compare_swap":
            return int(_native.cas_u64(addr, a & MASK64, b & MASK64))
        if kind == "fetch":
            return int(_native.load_u64(addr))
        old = int(_native.load_u64(addr))
        while (got := int(_native.cas_u64(addr, old, a & MASK64))) != old:
            old = got
        return old
    _native.store_u64(addr + PAD_LAST * stride, signaller + 1)
    old = int(_native.load_u64(addr))
    while True:
        if kind == "compare_swap" and old != a & MASK64:
            return old
        new = (old + a) & MASK64 if kind == "fetch_add" else (b if kind == "compare_swap" else a) & MASK64
        if arrival is not None:
            # logged before the word changes: a waiter that sees the value finds its arrival
            slot = addr + (PAD_LOG + 2 * (new % LOG_ENTRIES)) * stride
            _native.store_u64(slot + stride, arrival)
            _native.store_u64(slot, (new + 1) & MASK64)
        got = int(_native.cas_u64(addr, old, new))
        if got == old:
            break
        old = got
    seq = addr + PAD_SEQ * stride
    _native.fetch_add_u64(seq, 1)
    if _native.load_u64(addr + PAD_WAITERS * stride):
        _native.futex_wake(seq, 0x7FFFFFFF)
    return old
