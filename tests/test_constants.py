"""Constants and records that C and Python share have one definition, and both sides agree.

The native headers own every shared enumerator (``runtime/_native.h``, ``collectives/_kernels.h``);
the modules export them and Python imports them. These tests read the headers' enums themselves
(values computed as the C compiler would), so a new enumerator that is not exported, an export
with another value, or a Python table that stops following the export fails here. The Python
names native code reads (``_native.NAMES_READ``) are checked against the real objects.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import stratacl
from stratacl.collectives import _backend, _kernels, _reduce, _slices
from stratacl.runtime.communicator import _comm, _mesh, _meshops, _p2p, _prepared
from stratacl.runtime.services import _control
from stratacl.runtime import _native
from stratacl.runtime.pipeline import _protocol
from stratacl.runtime import NATIVE_CALLS

ROOT = Path(__file__).resolve().parents[1] / "stratacl"
_ENUM = re.compile(r"\benum\s*\{([^}]*)\}", re.S)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def header_enums(path: Path) -> dict[str, int]:
    """Every enumerator of the header's anonymous enums, with its value."""
    values: dict[str, int] = {}
    for body in _ENUM.findall(_COMMENT.sub("", path.read_text())):
        nxt = 0
        for item in filter(None, (i.strip() for i in body.split(","))):
            name, _, expr = (part.strip() for part in item.partition("="))
            if expr:
                # an initializer is an integer expression over earlier enumerators
                nxt = eval(re.sub(r"\b[A-Z_][A-Z0-9_]*\b", lambda m: str(values[m.group(0)]), expr), {})
            values[name] = nxt
            nxt += 1
    return values


NATIVE = header_enums(ROOT / "runtime" / "_native.h")
KERNELS = header_enums(ROOT / "collectives" / "_kernels.h")


def test_headers_are_read():
    # the parser itself: a few values known from the headers' text
    assert NATIVE["F_CALL"] == 15 and NATIVE["DESC_FIXED"] == 16 and NATIVE["PP_ME"] == 16
    assert NATIVE["RP_LEN"] == NATIVE["RP_BYTES"] + 6 and NATIVE["MESH_NOT_RUN"] == -1
    assert KERNELS["T_BOOL"] == 1 and KERNELS["OP_AVG"] == 5 and KERNELS["PLAN_COLUMNS"] == 8


@pytest.mark.parametrize("module, enums", [(_native, NATIVE), (_kernels, KERNELS)], ids=["_native", "_kernels"])
def test_every_enumerator_is_exported_with_its_value(module, enums):
    missing = sorted(name for name in enums if not hasattr(module, name))
    assert not missing, f"{module.__name__} does not export {missing}"
    wrong = {name: (getattr(module, name), v) for name, v in enums.items() if getattr(module, name) != v}
    assert not wrong, f"{module.__name__}: exported value != header value: {wrong}"


def test_descriptor_fields_come_from_native():
    for name in ("DESC_FIXED", *(n for n in NATIVE if n.startswith("F_"))):
        assert getattr(_control, name) == NATIVE[name], name
    assert _control.P2P_DESC == NATIVE["DESC_FIXED"]


def test_descriptors_are_built_in_field_order():
    # the descriptor tuples Python hands to native code are positional: every field lands at its F_*
    class Seg:
        va, size, hbm_offset, epoch = 1001, 1002, 1003, 1004

    class Inp:
        seg, addr, nbytes = Seg(), 1005, 1006

    f = _protocol.descriptor("all_reduce", 11, 12, 13, 14, Inp(), 15, 16)
    assert len(f) == NATIVE["DESC_FIXED"]
    want = {"F_OP": _protocol.OPS["all_reduce"], "F_DTYPE": 11, "F_COUNT": 12, "F_ROOT": 13, "F_REDOP": 14,
            "F_FLAGS": 0, "F_ADDR": 1005, "F_NBYTES": 1006, "F_SEG_VA": 1001, "F_SEG_SIZE": 1002, "F_SEG_OFF": 1003,
            "F_EPOCH": 1004, "F_AUX0": 15, "F_AUX1": 16, "F_AUX2": 0, "F_CALL": 0}      # native code numbers
    assert {k: f[NATIVE[k]] for k in want} == want
    s = _p2p._send_descriptor(21, 22, Inp(), False, 23, 24)
    assert len(s) == NATIVE["DESC_FIXED"]
    want = {"F_OP": _p2p.OP_SEND, "F_DTYPE": 21, "F_COUNT": 22, "F_ADDR": 1005, "F_NBYTES": 1006, "F_SEG_VA": 1001,
            "F_SEG_SIZE": 1002, "F_SEG_OFF": 1003, "F_EPOCH": 1004, "F_AUX0": 23, "F_CALL": 24}
    assert {k: s[NATIVE[k]] for k in want} == want
    rejected = _p2p._send_descriptor(21, 22, None, True, 0, 25)
    assert rejected[NATIVE["F_FLAGS"]] == _control.FLAG_REJECTED and rejected[NATIVE["F_CALL"]] == 25


def test_stages_and_words_come_from_native():
    # each Python name that stands for a native enumerator has its value (a copy would drift)
    for module in (_comm, _mesh, _meshops, _protocol, _p2p, _control):
        shared = [name for name in NATIVE if hasattr(module, name)]
        assert {name: getattr(module, name) for name in shared} == {name: NATIVE[name] for name in shared}
    used = {name for name in NATIVE for module in (_comm, _mesh, _meshops, _protocol) if hasattr(module, name)}
    assert {"MESH_SOURCES", "MESH_DEPART_WAIT", "MESH_ROOT", "T_CALLS", "T_NATIVE"} <= used
    assert {n for n in NATIVE if n.startswith("P2P_")} <= {name for name in NATIVE if hasattr(_p2p, name)}


def test_codes_and_plan_layout_come_from_the_kernels():
    assert sorted(_reduce.DTYPES.values()) == sorted(v for k, v in KERNELS.items() if k.startswith("T_"))
    assert {n: _reduce.REDUCE_OPS[n] for n in ("sum", "prod", "min", "max", "avg")} == {
        "sum": KERNELS["OP_SUM"], "prod": KERNELS["OP_PROD"], "min": KERNELS["OP_MIN"], "max": KERNELS["OP_MAX"],
        "avg": KERNELS["OP_AVG"]}
    assert _reduce.DTYPES[np.dtype(np.float16)] == KERNELS["T_F16"]
    assert _reduce.DTYPES[np.dtype(np.uint64)] == KERNELS["T_U64"]
    assert (_backend.COPY, _backend.GROUP, _backend.SRC, _backend.COPY_SHARED) == (
        KERNELS["K_COPY"], KERNELS["K_GROUP"], KERNELS["K_SRC"], KERNELS["K_COPY_SHARED"])
    assert (_slices.IN, _slices.OUT, _slices.SCRATCH) == (
        KERNELS["BUF_IN"], KERNELS["BUF_OUT"], KERNELS["BUF_SCRATCH"])
    c = _backend.Counters()
    c.local, c.pulled, c.written = 7, 8, 9
    assert len(c.words) == KERNELS["COUNTERS"]
    assert (c.words[KERNELS["CTR_LOCAL"]], c.words[KERNELS["CTR_PULLED"]], c.words[KERNELS["CTR_WRITTEN"]]) == (7, 8, 9)


def test_a_compiled_row_is_in_column_order():
    # one local copy and one two-source reduction, compiled, read back by the header's COL_*
    smap = _slices.Slices(0, *(np.array(v, dtype=np.int64) for v in (
        [0, 0, 1], [_slices.IN] * 3, [8, 16, 24], [_slices.OUT] * 3, [32, 40, 40], [4, 8, 8],
        [_slices.LOAD, _slices.LOAD_ACC, _slices.LOAD_ACC], [0, 0, 0])))
    table = _backend.compile(smap, itemsize=4).table
    assert table.shape[1] == KERNELS["PLAN_COLUMNS"]
    col = {k: v for k, v in KERNELS.items() if k.startswith("COL_")}
    copy = {k: int(table[0, v]) for k, v in col.items()}
    assert copy == {"COL_KIND": KERNELS["K_COPY"], "COL_SRC_RANK": 0, "COL_SRC_BUF": KERNELS["BUF_IN"],
                    "COL_SRC_OFF": 8, "COL_DST_RANK": 0, "COL_DST_BUF": KERNELS["BUF_OUT"], "COL_DST_OFF": 32,
                    "COL_BYTES": 4}
    assert table[1, col["COL_KIND"]] == KERNELS["K_GROUP"] and table[1, col["COL_SRC_RANK"]] == 2
    assert list(table[2:, col["COL_KIND"]]) == [KERNELS["K_SRC"]] * 2
    assert list(table[2:, col["COL_SRC_RANK"]]) == [0, 1] and list(table[2:, col["COL_SRC_OFF"]]) == [16, 24]


def _names_read_missing(comm):
    x = stratacl.empty((4,), np.float32)
    comm.all_reduce(x)
    comm.all_reduce(x)       # prepared: an entry with a MeshCall
    entry = next(iter(comm._prepared._entries.values()))
    objects = {"Communicator": comm, "PreparedCall": entry, "checked arguments": entry.args,
               "MeshCall": entry.args.replay}
    missing = [(name, owner) for name, owner in _native.NAMES_READ
               if owner in objects and not hasattr(objects[owner], name)]
    # the communicator's view for native code, item by item (NV_*)
    view = comm._native_view
    items = {"NV_CX": view[_native.NV_CX] is comm._protocol.cx,
             "NV_ARRIVED": view[_native.NV_ARRIVED] == comm._protocol.arrived,
             "NV_PREPARED": view[_native.NV_PREPARED] is comm._prepared._entries,
             "NV_MESH_STOPPED": view[_native.NV_MESH_STOPPED] == comm._mesh.resume,
             "NV_P2P_STOPPED": view[_native.NV_P2P_STOPPED] == comm._p2p.replayed}
    return missing, sorted(stratacl.stats()), type(entry).__name__, len(view) == _native.NV_LEN and all(items.values())


def test_names_native_code_reads_exist_where_it_reads_them():
    owners = {owner for _, owner in _native.NAMES_READ}
    assert owners == {"Communicator", "PreparedCall", "MeshCall", "checked arguments", "operation", "stats"}, owners
    # of the communicator, one declared structure only
    assert [name for name, owner in _native.NAMES_READ if owner == "Communicator"] == ["_native_view"]
    for missing, stats_keys, entry_type, view_ok in stratacl.spawn(_names_read_missing, 2, timeout=60):
        assert missing == [] and entry_type == _prepared.PreparedCall.__name__ and view_ok
        assert {name for name, owner in _native.NAMES_READ if owner == "stats"} <= set(stats_keys)
    assert {name for name, owner in _native.NAMES_READ if owner == "operation"} <= set(NATIVE_CALLS)


def test_the_operator_table_is_the_one_list_and_agrees_with_the_native_layer():
    from stratacl import _operators, _sizes
    from stratacl.collectives import _schedule
    table = _operators.OPERATORS
    # the native layer owns the point-to-point codes (_native.h): the table's rows name them
    assert {op.name: op.code for op in table if op.family == "p2p"} == {
        "send": NATIVE["OP_SEND"], "recv": NATIVE["OP_RECV"], "sendrecv": NATIVE["OP_SENDRECV"]}
    assert (_native.OP_SEND, _native.OP_RECV, _native.OP_SENDRECV) == (
        NATIVE["OP_SEND"], NATIVE["OP_RECV"], NATIVE["OP_SENDRECV"])
    # every other list is read off the table
    assert _protocol.OPS == {op.name: op.code for op in table if op.family != "p2p"}
    assert NATIVE_CALLS == tuple(op.name for op in table if op.native)
    assert _schedule.OPS == _sizes.OPS == tuple(op.name for op in table if op.schedule)
    assert _schedule.RING_OPS == tuple(op.name for op in table if op.ring)
    assert set(_schedule.RING_OPS) == {"all_gather", "all_reduce", "reduce_scatter"}
    # a collective row is a communicator method; an operator has one code
    assert all(hasattr(stratacl.Communicator, op.name) for op in table if op.family in ("collective", "p2p", "group"))
    assert len({op.code for op in table}) == len(table)


def test_the_routing_records_layout_comes_from_the_native_pass():
    import re as _re

    from stratacl.collectives import _ep, _eproute
    source = (ROOT / "collectives" / "_eproute.c").read_text()
    assert int(_re.search(r"#define WEIGHT_WORDS (\d+)", source).group(1)) == _eproute.WEIGHT_WORDS == _ep.WEIGHT_WORDS
    # a record: its token, k expert ids, k float32 weights packed WEIGHT_WORDS to an int64 word
    assert _ep.record_words(8) == 1 + 8 + 8 // _eproute.WEIGHT_WORDS


def test_operation_codes_in_messages_are_names():
    # a rank in send (its code comes from the point-to-point table) while its peers are in
    # all_reduce, or a member whose descriptor holds no call yet, is named in words, not "op#N"
    from stratacl.runtime.services import _flight
    from stratacl.runtime.services import F_OP
    for op in ("all_reduce", "send", "recv", "sendrecv", "split", "dispatch"):
        code = next(o.code for o in stratacl._operators.OPERATORS if o.name == op)
        assert _protocol._value_name(F_OP, code) == op
        assert _flight._NAMES[code] == op
    assert _protocol._value_name(F_OP, 0) == "no call (its descriptor is empty)"
    assert _flight.op_name(0) == "no call" and _flight.op_name(999) == "an unknown operation (code 999)"
