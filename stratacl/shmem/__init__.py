"""One-sided communication on HBM arrays, in NVSHMEM's names (docs/one-sided.md).

    import numpy as np, stratacl
    from stratacl import shmem
    comm = stratacl.init()
    x = shmem.zeros(1024, np.float32)          # symmetric: same offset in every rank's HBM slice
    sig = shmem.signal_pad(4)                  # four u64 signal words, symmetric, zeroed
    right = (comm.rank + 1) % comm.size
    shmem.put_signal(x, data, sig[0:1], 1, shmem.SIGNAL_SET, right)   # data, then the signal
    shmem.wait_until(sig[0:1], shmem.CMP_GE, 1)                       # my left neighbour's data is in x
    shmem.barrier_all()

A symmetric object is named by this rank's own array (or address): ``pe``'s counterpart is the
object at the same offset of ``pe``'s slice of the shared address window. ``pe`` is a rank of
``comm`` (keyword, default: the world communicator). Every call is host-blocking and local
to this rank (no peer takes part) except ``empty``/``zeros``/``signal_pad``/``barrier_all``,
which are collective over ``comm``.

Ordering and visibility (what the tests check):

- ``put`` returns once its bytes are in ``pe``'s HBM; they are visible to other ranks at the
  latest after ``quiet()`` (or a ``barrier_all``); ``fence()`` orders this rank's puts (and
  atomics) to any one peer: a peer that sees a later one sees the earlier ones;
- ``put_signal``: when the signal is visible, so are the data (a full fence between them);
- ``wait_until`` returns once the signal word satisfies the condition; the data of every
  ``put_signal`` that contributed to the value seen is then readable;
- atomics (``atomic_*``) are sequentially consistent on 64-bit, 8-byte aligned words.

The runtime side (address translation and checks, signal words, modeled time) is
``stratacl.runtime.SymmetricHeap`` (runtime/_onesided.py).
"""
from ._api import CMP_EQ as CMP_EQ
from ._api import CMP_GE as CMP_GE
from ._api import CMP_GT as CMP_GT
from ._api import CMP_LE as CMP_LE
from ._api import CMP_LT as CMP_LT
from ._api import CMP_NE as CMP_NE
from ._api import SIGNAL_ADD as SIGNAL_ADD
from ._api import SIGNAL_SET as SIGNAL_SET
from ._api import atomic_compare_swap as atomic_compare_swap
from ._api import atomic_fetch as atomic_fetch
from ._api import atomic_fetch_add as atomic_fetch_add
from ._api import atomic_set as atomic_set
from ._api import barrier_all as barrier_all
from ._api import buffer_register as buffer_register
from ._api import empty as empty
from ._api import fence as fence
from ._api import get as get
from ._api import my_pe as my_pe
from ._api import n_pes as n_pes
from ._api import peer_view as peer_view
from ._api import ptr as ptr
from ._api import put as put
from ._api import put_signal as put_signal
from ._api import quiet as quiet
from ._api import signal_fetch as signal_fetch
from ._api import signal_pad as signal_pad
from ._api import wait_until as wait_until
from ._api import zeros as zeros

__all__ = ["CMP_EQ", "CMP_GE", "CMP_GT", "CMP_LE", "CMP_LT", "CMP_NE", "SIGNAL_ADD", "SIGNAL_SET",
           "atomic_compare_swap", "atomic_fetch", "atomic_fetch_add", "atomic_set", "barrier_all", "buffer_register",
           "empty", "fence", "get", "my_pe", "n_pes", "peer_view", "ptr", "put", "put_signal", "quiet",
           "signal_fetch", "signal_pad", "wait_until", "zeros"]
