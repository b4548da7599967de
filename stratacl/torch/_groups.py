"""Process groups from torch's calls: the world group is the job's world communicator, and a
group from ``new_group`` (or a ``DeviceMesh`` dimension) is a sub-communicator of its members.

torch calls the backend's creator on the members of a new group only, so a sub-group cannot
be a ``split`` (collective over the whole parent): it is ``Communicator.subgroup``, which the
members make alone, agreeing on their communicator slots through the group's key-value store
that torch hands the creator.
"""
from __future__ import annotations

import stratacl

from ._process_group import ProcessGroupStrataCL


def create(options, backend_options=None) -> ProcessGroupStrataCL:
    """torch's creator for backend "stratacl" (registered with ``extended_api=True``): called by
    ``init_process_group`` and ``new_group`` on every member of the group."""
    world = stratacl.init()
    members = list(options.global_ranks_in_group) or list(range(options.group_size))
    if not options.global_ranks_in_group:
        if (world.rank, world.size) != (options.group_rank, options.group_size):
            raise stratacl.BootstrapError(
                f"init_process_group('stratacl'): torch was given rank {options.group_rank} of "
                f"{options.group_size}, but this process is rank {world.rank} of a {world.size}-rank StrataCL job; "
                f"start the program with stratacl-launch, or torchrun or mpirun on one host (docs/cluster.md), "
                f"and let init_process_group read RANK and WORLD_SIZE from them (env://)")
        return ProcessGroupStrataCL(world, options.timeout)
    store = options.store

    def agree(slot: int) -> list[int]:
        store.set(f"stratacl/slot/{options.group_rank}", str(slot))
        return [int(store.get(f"stratacl/slot/{i}")) for i in range(options.group_size)]

    return ProcessGroupStrataCL(world.subgroup(members, agree), options.timeout)
