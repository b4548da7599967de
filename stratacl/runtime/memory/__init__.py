"""Memory and registration: a rank's HBM, the shared address window, the allocators, and the
unit that makes every allocation readable by the peers.

    _segments      the job's shared-memory segments (one control segment, one HBM segment a
                   rank), created 0600 and unlinked at once; ``_names``: the job's unpredictable
                   names in /dev/shm
    _window        the shadow virtual-address window every rank reserves (rank r owns slice r)
    _hbm           a rank's HBM: physical ranges carved out of its segment, released after
                   every peer acknowledged
    _allocator     the caching allocator (numpy arrays in HBM) and what the allocators share;
                   ``_expandable``: the expandable one (chunks mapped as a pool grows)
    _memstats      memory statistics under torch.cuda.memory_stats()'s names
    _registration  the registration unit: a mapped segment or chunk is announced to every peer,
                   which maps it at the same address in the background (roa), at first use
                   (jit) or once (pool)

    allocation --> Hbm range --> mapped in the window --> RegistrationUnit announces it
                                                        --> peers map it at the same address
"""
from ._allocator import CachingAllocator as CachingAllocator
from ._allocator import array_from_block as array_from_block
from ._allocator import fmt_bytes as fmt_bytes
from ._allocator import hbm_base as hbm_base
from ._expandable import ExpandableAllocator as ExpandableAllocator
from ._hbm import Hbm as Hbm
from ._memstats import summary as summary_table
from ._names import create_semaphore as create_semaphore
from ._names import new_job_id as new_job_id
from ._names import refused as refused
from ._registration import RegistrationUnit as RegistrationUnit
from ._registration import array_extent as array_extent
from ._registration import hbm_runs as hbm_runs
from ._segments import create_job_segments as create_job_segments
from ._segments import open_job_segments as open_job_segments
from ._segments import prefix as prefix
from ._segments import slice_bytes_for as slice_bytes_for
from ._segments import unlink_job_names as unlink_job_names
from ._window import ShadowWindow as ShadowWindow
from ._window import check_window as check_window
from ._window import round_up as round_up

__all__ = [
    "CachingAllocator", "ExpandableAllocator", "Hbm", "RegistrationUnit", "ShadowWindow", "array_extent",
    "array_from_block", "check_window", "create_job_segments", "create_semaphore", "fmt_bytes", "hbm_base", "hbm_runs",
    "new_job_id", "open_job_segments", "prefix", "refused", "round_up", "slice_bytes_for", "summary_table",
    "unlink_job_names",
]
