"""Device-driven SDMA offload in the model (paper 6.3, 9.5): descriptors, queues, engine, completion.

    units of a phase + the policy (which core owns which unit, in what order)
        |  descriptors(): each unit -> descriptors of at most ``sdma.max_descriptor_bytes``
        v
    core c, for its units in order: build + post each descriptor into queue c
        (``sdma.descriptor_us`` each), then ring the doorbell once (``sdma.doorbell_us``);
        the core is then released (cross-kernel ``notify``) or, in in-kernel ``flag`` mode, one
        of ``sdma.poll_cores`` cores polls the tail flag until it flips
        |
        v
    engine: descriptors of the rung queues, round-robin over queues in post order, as one
        pipelined stream: it issues a descriptor's read requests at R = ``sdma.efficiency`` x S
        (S: the rank's fabric share, as the MTE path gets) as soon as the previous
        descriptor's requests are out and its queue's doorbell has rung; the descriptor's
        data is complete alpha_t (the pair's access latency) after its last request. The
        latencies of back-to-back descriptors overlap, as a core's double-buffered units do
        on the MTE path; only a descriptor issued into an idle engine exposes its own.
        After a queue's last data descriptor its tail descriptor writes the completion flag
        (flag mode) or a notify record (notify mode).
        |
        v
    completion: flag: the polling core sees the last tail flag; notify: ``sdma.notify_us`` later
        the waiting operation is released

What the model does NOT write in: the latency penalty against the MTE path comes from the
descriptors' build time before the doorbell and from the engine's rate (``sdma.efficiency`` of
the share); the cores' occupation falls because they spend
``descriptor_us`` per descriptor instead of the whole transfer. Both follow from the
parameters in the topology's ``sdma`` section (their sources are noted there).
"""
from __future__ import annotations

import dataclasses

import numpy as np

PATHS = ("mte", "sdma")
COMPLETIONS = ("flag", "notify")


def paths_of(setting: str) -> tuple[str, str]:
    """The data paths of a blocking call and of an asynchronous one (``async_op=True``) under
    the ``path`` setting. ``auto``: the cores' MTEs for calls the program waits on, the SDMA
    engine for calls that overlap its compute (the paper's default path and its offload for
    compute-communication overlap, §6.3); ``mte`` and ``sdma``: that path for every call."""
    return ("mte", "sdma") if setting == "auto" else (setting, setting)


@dataclasses.dataclass(frozen=True)
class SdmaRun:
    """One phase on the SDMA path, us from the phase's start."""
    build_end: np.ndarray       # per core: when it finished building + posting (nan: no work)
    doorbell_end: np.ndarray    # per core: after its doorbell
    poll_end: np.ndarray        # per core: end of polling (nan: not a polling core)
    desc_start: np.ndarray      # per descriptor, engine side
    desc_end: np.ndarray
    desc_core: np.ndarray
    end: float                  # when the phase's data is complete and seen (flag or notify)
    busy: np.ndarray            # per core occupation (build + doorbell + poll)

    def gap(self) -> float:
        e = self.doorbell_end[~np.isnan(self.doorbell_end)]
        return float((e.max() - e.min()) / e.max()) if e.size and e.max() > 0 else 0.0


def descriptors(nbytes: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(unit index, bytes) of every descriptor when units are split at ``max_bytes``."""
    k = np.maximum(-(-nbytes // max_bytes), 1)
    u = np.repeat(np.arange(nbytes.size), k)
    first = np.repeat(np.cumsum(k) - k, k)
    off = (np.arange(u.size) - first) * max_bytes
    return u, np.minimum(max_bytes, nbytes[u] - off)


def run_sdma(nbytes: np.ndarray, alpha: np.ndarray, core: np.ndarray, slot: np.ndarray, cores: int,
             share: float, sdma, completion: str = "flag") -> SdmaRun:
    """Timelines of one phase offloaded to the engine (``sdma``: a topology ``Sdma``)."""
    if completion not in COMPLETIONS:
        raise ValueError(f"completion must be one of {', '.join(COMPLETIONS)}, got {completion!r}")
    nan = np.full(cores, np.nan)
    if nbytes.size == 0:
        return SdmaRun(nan, nan.copy(), nan.copy(), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), 0.0,
                       np.zeros(cores))
    order = np.lexsort((slot, core))
    du, db = descriptors(nbytes[order], int(sdma.max_descriptor_bytes))
    dcore = core[order][du]
    dalpha = alpha[order][du]
    # core side: descriptor j of core c is posted at (its index in c's queue + 1) x descriptor_us
    start = np.searchsorted(dcore, np.arange(cores))
    idx = np.arange(du.size) - start[dcore]
    count = np.bincount(dcore, minlength=cores)
    has = count > 0
    build_end = np.where(has, count * sdma.descriptor_us, np.nan)
    bell = np.where(has, build_end + sdma.doorbell_us, np.nan)
    # engine side: round-robin over queues (index in queue, then core), available at the doorbell;
    # issue ends by the max-plus recurrence e_i = max(e_(i-1), avail_i) + d_i, in closed form
    eorder = np.lexsort((dcore, idx))
    avail = bell[dcore][eorder]
    rate = share * sdma.efficiency if share > 0 else np.inf     # bytes/us
    d = db[eorder] / rate
    issued = np.cumsum(d)
    issued += np.maximum.accumulate(avail - (issued - d))
    ends = issued + dalpha[eorder]
    desc_start, desc_end = np.empty(du.size), np.empty(du.size)
    desc_start[eorder], desc_end[eorder] = issued - d, ends
    data_end = float(ends.max())
    poll = nan.copy()
    busy = np.where(has, bell, 0.0)
    if completion == "flag":
        end = data_end                          # the tail flag is written locally (pull mode)
        pollers = np.nonzero(has)[0][:int(sdma.poll_cores)]
        poll[pollers] = end
        busy[pollers] = end                     # a polling core stays occupied until the flag flips
    else:
        end = data_end + sdma.notify_us
    return SdmaRun(build_end, bell, poll, desc_start, desc_end, dcore, end, busy)
