"""When a host's carrier fails or another host is lost (a job over hosts: runtime/hosts/_carrier.py):
``failed`` ends the job on this host, naming the carrier or the lost host (``HostLost``, from
MPI's word that a process failed: ``lost_hosts``), and tells the other hosts as far as MPI
still goes (TAG_FAILED).
"""
from __future__ import annotations

from typing import Sequence

from ..services import FAILED_CARRIER, carrier_failure, host_lost

TAG_FAILED = 13                      # carrier-to-carrier: the job's first failure, (rank, kind, value)


class HostLost(RuntimeError):
    """Another host's carrier process (a host launcher, or a carrier of its own) died: MPI says
    it failed (MPI_ERR_PROC_FAILED, Open MPI's fault tolerance). ``host``, ``value``: the lost
    host and FAILED_CARRIER's value naming it with its ranks."""

    def __init__(self, host: int, host_of: Sequence[int], why: str):
        ranks = [r for r, h in enumerate(host_of) if h == host] or [0]
        self.host, self.value = host, host_lost(host, ranks[0], ranks[-1])
        super().__init__(f"{carrier_failure(self.value)} (MPI: {why})")


def lost_hosts(comm, error: BaseException) -> list[int]:
    """The hosts (ranks of ``comm``) MPI knows died, if ``error`` is MPI's word that a process
    failed; else []."""
    from mpi4py import MPI
    if not isinstance(error, MPI.Exception) or error.Get_error_class() not in (
            MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED):
        return []
    try:
        group = comm.Get_failed()
        gone = group.Translate_ranks(list(range(group.Get_size())), comm.Get_group())
    except Exception:          # noqa: BLE001 - an MPI without the query: the error still says it
        return []
    return sorted(int(g) for g in gone if g is not None and g >= 0)


def failed(ctl, carrier, error: BaseException, comm=None) -> BaseException:
    """Carrier ``carrier`` failed with ``error``: say so on stderr, end the job on this host (its
    ranks raise PeerFailure naming the carrier's host at their next wait, or the host that was
    lost when MPI says another host's process died) and, as far as MPI still goes, on the
    others. Returns the error the launcher reports (a HostLost when a host was lost); the first
    call's, whichever thread made it."""
    with carrier.failing:
        if carrier.failure is None:
            carrier.failure = _failed(ctl, carrier, error, comm)
    return carrier.failure


def _failed(ctl, carrier, error: BaseException, comm) -> BaseException:
    import sys

    gone = lost_hosts(carrier.comm if comm is None else comm, error)
    if gone:
        error = HostLost(gone[0], carrier.host_of, str(error).strip())
        print(f"stratacl: host {carrier.host}: {error}", file=sys.stderr, flush=True)
        value = error.value
    else:
        print(f"stratacl: the carrier of host {carrier.host} failed: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)
        value = carrier.host
    ctl.record_shutdown(value, FAILED_CARRIER)
    try:
        for g in range(carrier.comm.size):
            if g != carrier.host and g not in gone:
                carrier.outstanding.append(carrier.comm.isend((-1, FAILED_CARRIER, value), dest=g,
                                                              tag=TAG_FAILED))
    except Exception:          # noqa: BLE001 - MPI itself may be what failed
        pass
    return error
