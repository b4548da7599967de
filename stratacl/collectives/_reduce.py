"""Reduce operations and the dtypes collectives accept.

Accumulation order (documented, and the same on every rank): the result element is
``((x_0 op x_1) op x_2) ... op x_{N-1}`` in communicator-rank order, computed in the array's
own dtype with numpy's semantics (integers wrap, bool ``sum`` is logical or, bool ``prod``
logical and). ``avg`` is that sum divided by N in the same dtype, for floating dtypes only.
"""
from __future__ import annotations

import numpy as np

DTYPES = {np.dtype(t): code for code, t in enumerate(
    (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
     np.uint16, np.uint32, np.uint64), start=1)}
DTYPE_BY_CODE = {code: dt for dt, code in DTYPES.items()}

REDUCE_OPS = {"sum": 1, "prod": 2, "min": 3, "max": 4, "avg": 5}
REDUCE_NAMES = {v: k for k, v in REDUCE_OPS.items()}


def dtype_code(dtype: np.dtype, operation: str) -> int:
    code = DTYPES.get(dtype) if isinstance(dtype, np.dtype) else None
    if code is not None:
        return code
    try:
        return DTYPES[np.dtype(dtype)]
    except KeyError:
        names = ", ".join(str(d) for d in DTYPES)
        raise TypeError(f"{operation}: dtype {np.dtype(dtype)} is not supported (supported: {names})") from None


def reduce_code(op: str, dtype: np.dtype, operation: str) -> int:
    code = REDUCE_OPS.get(str(op).lower())
    if code is None:
        raise ValueError(f"{operation}: unknown reduce op {op!r} (expected one of {', '.join(REDUCE_OPS)})")
    if code == 5 and np.dtype(dtype).kind != "f":
        raise TypeError(f"{operation}: op 'avg' needs a floating dtype, got {np.dtype(dtype)}")
    return code
