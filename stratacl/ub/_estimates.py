"""What the two estimate APIs share (``stratacl.estimate`` for collectives, ``stratacl.ep.estimate``
for MoE calls): a fabric model made once per settings, and their results' JSON form."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ._clock import FabricModel


@functools.lru_cache(maxsize=32)
def cached_model(topology: str, registration: str, cores: int | None = None, comm_cores: int | None = None,
                 partition: str = "balanced", path: str = "mte", *, eager_bytes: int) -> FabricModel:
    """The fabric model of these settings, made on first use (its plans are cached with it)."""
    return FabricModel(topology, registration, cores=cores, comm_cores=comm_cores, partition=partition, path=path,
                       eager_bytes=eager_bytes)


class ModeledCost:
    """A frozen dataclass of one call's modeled cost, with ``times_us`` per rank (numpy)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (``times_us`` as a list)."""
        d = dataclasses.asdict(self)
        d["times_us"] = self.times_us.tolist()
        return d
