"""torch.distributed backend "stratacl": unmodified PyTorch CPU programs on the emulated supernode.

    import stratacl.torch                      # registers the backend (devices: cpu)
    import torch.distributed as dist
    dist.init_process_group("stratacl")        # under stratacl-launch, as under torchrun
    x = stratacl.torch.zeros(1024)             # storage in this rank's HBM: zero copy
    dist.all_reduce(x)

Importing this module imports torch; ``import stratacl`` alone never does. The mapping of
torch's operations onto the communicator is in _process_group.py, how they are run and what their
TorchWork does in _ordering.py, the tensors in _tensors.py, groups in _groups.py; docs/torch.md tells
the whole story. ``symm_mem`` (symm_mem.py) is torch.distributed._symmetric_memory's API over
HBM (docs/one-sided.md), a module as torch's is: ``import stratacl.torch.symm_mem as symm_mem``.
"""
from __future__ import annotations

import torch.distributed as _dist

from . import symm_mem as symm_mem
from ._process_group import ProcessGroupStrataCL as ProcessGroupStrataCL
from ._groups import create as _create
from ._store import install as _install_store
from ._tensors import empty as empty
from ._tensors import empty_like as empty_like
from ._tensors import zeros as zeros
from ._ordering import TorchWork as TorchWork

BACKEND = "stratacl"

__all__ = ["BACKEND", "ProcessGroupStrataCL", "TorchWork", "empty", "empty_like", "symm_mem", "zeros"]

if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
# env:// in a job of stratacl-launch: the job's store, on loopback, with its secret (_store.py)
_install_store()
