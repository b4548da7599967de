"""Tensors as the communicator's numpy arrays, and tensors whose storage is HBM.

    torch.Tensor (CPU, dense, contiguous) --array()--> numpy view of the same bytes
        float32/64, float16, int8-64, uint8-64, bool   the numpy dtype of the same name
        bfloat16                                       int16 (numpy has no bfloat16): moved as is;
                                                       reductions are done by torch (_reduce.py)
        complex64/128                                  float32/64 pairs (view_as_real)

No byte is copied: the communicator sees the tensor's own memory, so a tensor made by
``empty``/``zeros``/``empty_like`` here (storage in this rank's HBM) is read by peers in place
(zero copy), and any other tensor takes the communicator's staged path.

The view of an HBM tensor is cut from the HBM array its storage was made from (``_HBM``), not
made by ``Tensor.numpy()``, whose base is a tensor: the communicator then sees an array that
holds its HBM block, the condition for remembering a call (runtime/communicator/_prepared.py). And a
tensor's view is kept while the tensor lives (``_VIEWS``), so a program that calls the same
operation on the same tensors again and again hands the communicator the same arrays again
and again, and its repeated-call fast path (the checks made once, the call replayed in native
code) engages through torch as it does for numpy programs. Without both, every call through
torch ran the full argument checks and built its mesh record afresh (docs/performance.md,
"torch.distributed").
"""
from __future__ import annotations

import weakref

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


# the HBM array behind each live tensor storage made by empty(), by storage address; the array
# lives exactly as long as the storage (torch.from_numpy holds it), so its entry goes with it
_HBM: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
# id(tensor) -> (weak reference to it, its data address, shape, strides, its view): see the module
# docstring; an entry goes when its tensor does, and the whole table when it passes VIEWS_LIMIT
_VIEWS: dict[int, tuple] = {}
VIEWS_LIMIT = 256
# the numpy dtype each torch dtype is moved as (complex: its float pairs)
_MOVED = {**NATIVE, torch.bfloat16: np.int16, torch.complex64: np.float32, torch.complex128: np.float64}


def checked(t: torch.Tensor, operation: str, what: str = "tensor") -> np.ndarray:
    """``check(t)``, then ``array(t)``; a tensor whose view is kept, unchanged since (same
    object, data address, shape and strides), passed the checks then and skips them."""
    e = _VIEWS.get(id(t))
    if e is not None and e[0]() is t and e[1] == t.data_ptr() and e[2] == t.shape and e[3] == t.stride():
        return e[4]
    check(t, operation, what)
    return _keep(t)


def array(t: torch.Tensor) -> np.ndarray:
    """The numpy view of ``t``'s bytes the communicator moves (see the module docstring),
    1-D; the same array object on every call while ``t`` is unchanged. ``t`` passed ``check``."""
    e = _VIEWS.get(id(t))
    if e is not None and e[0]() is t and e[1] == t.data_ptr() and e[2] == t.shape and e[3] == t.stride():
        return e[4]
    return _keep(t)


def _keep(t: torch.Tensor) -> np.ndarray:
    a = _view(t)
    if len(_VIEWS) >= VIEWS_LIMIT:
        _VIEWS.clear()
    key = id(t)
    _VIEWS[key] = (weakref.ref(t, lambda ref, key=key: _forget(key, ref)), t.data_ptr(), t.shape, t.stride(), a)
    return a


def _forget(key: int, ref: weakref.ref) -> None:
    e = _VIEWS.get(key)
    if e is not None and e[0] is ref:
        del _VIEWS[key]


def _view(t: torch.Tensor) -> np.ndarray:
    nbytes = t.numel() * t.element_size()
    hbm = _HBM.get(t.untyped_storage().data_ptr()) if nbytes else None
    if hbm is not None:
        start = t.storage_offset() * t.element_size()
        return hbm.reshape(-1).view(np.uint8)[start:start + nbytes].view(_MOVED[t.dtype])
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
        a = stratacl.empty(size, NATIVE[dtype])
    elif dtype is torch.bfloat16:
        a = stratacl.empty(size, np.int16)
    elif dtype in (torch.complex64, torch.complex128):
        a = stratacl.empty(size, np.complex64 if dtype is torch.complex64 else np.complex128)
    else:
        raise TypeError(f"stratacl.torch.empty: dtype {dtype} is not supported")
    t = torch.from_numpy(a)
    if a.nbytes:
        _HBM[t.untyped_storage().data_ptr()] = a
    return t.view(torch.bfloat16) if dtype is torch.bfloat16 else t


def zeros(*size, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``empty`` filled with zeros."""
    t = empty(*size, dtype=dtype)
    t.zero_()
    return t


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``empty`` with the shape (and dtype, unless given) of ``t``."""
    return empty(tuple(t.shape), dtype=t.dtype if dtype is None else dtype)

