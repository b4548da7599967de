"""Tensors as the communicator's numpy arrays, and tensors whose storage is HBM.

    torch.Tensor (CPU, dense, contiguous) --array()--> numpy view of the same bytes
        float32/64, float16, int8-64, uint8-64, bool   the numpy dtype of the same name
        bfloat16                                       int16 (numpy has no bfloat16): moved as is;
                                                       reductions are done by torch (_reduce.py)
        complex64/128                                  float32/64 pairs (view_as_real)

No byte is copied: the communicator sees the tensor's own memory, so a tensor made by
``empty``/``zeros``/``empty_like`` here (storage in this rank's HBM) is read by peers in place
(zero copy), and any other tensor takes the communicator's staged path.
"""
from __future__ import annotations

import numpy as np
import torch

import stratacl

# torch dtypes the communicator reduces itself (collectives/_reduce.py): same bits as torch's
# elementwise op in rank order (tests/test_torch_backend.py checks it)
NATIVE = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16, torch.float32: np.float32,
          torch.float64: np.float64, torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}
# moved as another dtype of the same size
CARRIED = {torch.bfloat16: torch.int16, torch.complex64: torch.float32, torch.complex128: torch.float64}


def check(t: torch.Tensor, operation: str, what: str = "tensor") -> None:
    """Refuse, as gloo does, what the communicator cannot take as it is: another device, a
    sparse or non-contiguous tensor, a dtype it cannot move. Raises on this rank only; peers of
    a collective see a mismatch or a timeout, as with gloo."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"stratacl {operation}: the {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"stratacl {operation}: the {what} is on {t.device}; the stratacl backend moves CPU "
                         f"tensors only")
    if t.layout is not torch.strided:
        raise ValueError(f"stratacl {operation}: the {what} has layout {t.layout}; only dense tensors are supported")
    if not t.is_contiguous():
        raise ValueError(f"stratacl {operation}: the {what} is not contiguous (shape {tuple(t.shape)}, strides "
                         f"{t.stride()}); pass t.contiguous() and copy the result back")
    if t.dtype not in NATIVE and t.dtype not in CARRIED:
        raise TypeError(f"stratacl {operation}: dtype {t.dtype} is not supported (supported: "
                        f"{', '.join(str(d).removeprefix('torch.') for d in (*NATIVE, *CARRIED))})")


def array(t: torch.Tensor) -> np.ndarray:
    """The numpy view of ``t``'s bytes the communicator moves (see the module docstring),
    1-D. ``t`` passed ``check``."""
    t = t.detach()
    carried = CARRIED.get(t.dtype)
    if carried is not None:
        t = torch.view_as_real(t) if t.is_complex() else t.view(carried)
    return t.reshape(-1).numpy()


def empty(*size, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised CPU tensor whose storage is in this rank's HBM: collectives read it
    in place (zero copy). ``size`` as for ``torch.empty``; ``dtype`` defaults to torch's default.
    The HBM block returns to the allocator's cache when the tensor (and every view of it) is
    gone. Local; needs ``stratacl.init()`` (done by ``init_process_group("stratacl")``)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype in NATIVE:
        return torch.from_numpy(stratacl.empty(size, NATIVE[dtype]))
    if dtype is torch.bfloat16:
        return torch.from_numpy(stratacl.empty(size, np.int16)).view(torch.bfloat16)
    if dtype in (torch.complex64, torch.complex128):
        return torch.from_numpy(stratacl.empty(size, np.complex64 if dtype is torch.complex64 else np.complex128))
    raise TypeError(f"stratacl.torch.empty: dtype {dtype} is not supported")


def zeros(*size, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``empty`` filled with zeros."""
    t = empty(*size, dtype=dtype)
    t.zero_()
    return t


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``empty`` with the shape (and dtype, unless given) of ``t``."""
    return empty(tuple(t.shape), dtype=t.dtype if dtype is None else dtype)

