"""The public surface: exports, settings, topology files. No ranks needed."""
from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib

import pytest

import stratacl
from stratacl import _config
from stratacl.ub import load_topology

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_public_names_are_exported_and_nothing_private_leaks():
    for name in stratacl.__all__:
        assert hasattr(stratacl, name) or name == "config", name
    public = {n for n in dir(stratacl) if not n.startswith("_")}
    # subpackages: a package's attribute once anything in the process imported it (stratacl.torch
    # by another test of the same worker, say)
    modules = {"ub", "runtime", "collectives", "bench", "sdma", "jobs", "ep", "shmem", "torch", "fabric"}
    assert public - set(stratacl.__all__) - modules == set()


def test_estimate_is_public_and_needs_no_ranks():
    assert {"estimate", "Estimate"} <= set(stratacl.__all__)
    e = stratacl.estimate("all_reduce", 32, 1 << 20, algo="auto")
    assert isinstance(e, stratacl.Estimate) and e.time_us > 0 and not stratacl.is_initialized()


def test_import_has_no_side_effects():
    assert not stratacl.is_initialized()
    with pytest.raises(stratacl.NotInitialized, match="call stratacl.init"):
        stratacl.empty((1,))


def test_error_tree():
    assert issubclass(stratacl.StrataError, RuntimeError)
    assert issubclass(stratacl.OutOfMemory, MemoryError) and issubclass(stratacl.OutOfMemory, stratacl.StrataError)
    assert issubclass(stratacl.CommTimeout, TimeoutError)
    for e in (stratacl.BootstrapError, stratacl.RegistrationError, stratacl.CollectiveMismatch,
              stratacl.PeerFailure, stratacl.ConfigError, stratacl.RankFailure, stratacl.NotInitialized,
              stratacl.TooManyCommunicators):
        assert issubclass(e, stratacl.StrataError)


def test_settings_parse_and_reject_typos():
    cfg = _config.Config({"STRATACL_HBM_SIZE": "512M", "STRATACL_REGISTRATION": "JIT"})
    assert cfg.hbm_size == 512 * 1024**2 and cfg.registration == "jit"
    with pytest.raises(stratacl.ConfigError, match="STRATACL_REGISTRATION='foo'"):
        _config.Config({"STRATACL_REGISTRATION": "foo"})
    with pytest.raises(stratacl.ConfigError, match="did you mean 'timeout'"):
        _config.Config({}, timeoutt=3)
    with pytest.raises(stratacl.ConfigError, match="STRATACL_TIMEOUTT"):
        _config.check_environment({"STRATACL_TIMEOUTT": "3"})
    assert _config.parse_size("4G") == 4 * 1024**3 and _config.parse_size("64KiB") == 65536


def test_settings_out_of_range_are_refused_with_their_name():
    # a timeout of -1 or 0 would make every wait fail at once; NaN compares false everywhere
    for name, value, words in [("timeout", -1, "> 0"), ("timeout", 0, "> 0"), ("timeout", "nan", "> 0"),
                               ("dilation", 0, "> 0"), ("cores", 0, "> 0"), ("comm_cores", -2, "> 0"),
                               ("hbm_size", "0", "> 0"), ("grace", -0.5, ">= 0"), ("deadline", -1, ">= 0"),
                               ("pool_size", -4096, ">= 0")]:
        with pytest.raises(stratacl.ConfigError, match=rf"^{name}={value!r}: expected a number {words}, got"):
            _config.Config({}, **{name: value})
    with pytest.raises(stratacl.ConfigError, match=r"^STRATACL_TIMEOUT='-3': expected a number > 0"):
        _config.Config({"STRATACL_TIMEOUT": "-3"})
    cfg = _config.Config({}, timeout=0.5, grace=0, deadline=0, pool_size=0)
    assert (cfg.timeout, cfg.grace, cfg.deadline, cfg.pool_size) == (0.5, 0.0, 0.0, 0)


def test_the_reference_s_settings_table_is_the_generated_one():
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert _config.settings_table() in reference, "regenerate with: python -m stratacl._config"


def test_builtin_topologies():
    cm = load_topology("cm384")
    assert cm.tier(0, 1).name == "die-to-die" and cm.tier(0, 1).latency_us == 0.2
    assert cm.tier(0, 2).name == "intra-node" and cm.tier(0, 15).bandwidth_gbps == 170
    assert cm.tier(0, 16).name == "inter-node" and cm.tier(0, 16).latency_us == 2.1
    assert cm.tier(0, 64).name == "inter-node"
    assert cm.location(37) == {"die": 37, "npu": 18, "node": 2, "rack": 0, "supernode": 0}
    assert "die-to-die" in cm.describe(32)
    flat = load_topology("flat")
    assert flat.tier(0, 5).name == "fabric"


def test_topology_file_errors_name_the_field(tmp_path):
    good = {"name": "nvl72-like", "levels": [{"name": "gpu", "size": 1, "tier": "local"},
                                              {"name": "rack", "size": 72, "tier": "nvlink"}],
            "tiers": {"local": {"latency_us": 0.1, "bandwidth_gbps": 2000},
                      "nvlink": {"latency_us": 1.0, "bandwidth_gbps": 900}}, "beyond": "nvlink"}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(good))
    t = load_topology(str(p))
    assert t.tier(0, 71).name == "nvlink" and t.tier(0, 72).name == "nvlink"
    bad = json.loads(json.dumps(good))
    del bad["tiers"]["nvlink"]["bandwidth_gbps"]
    p.write_text(json.dumps(bad))
    with pytest.raises(stratacl.ConfigError, match=r"tiers\.nvlink\.'bandwidth_gbps'"):
        load_topology(str(p))
    bad = json.loads(json.dumps(good))
    bad["levels"][1]["size"] = "72"
    p.write_text(json.dumps(bad))
    with pytest.raises(stratacl.ConfigError, match=r"levels\[1\]\.'size' must be int"):
        load_topology(str(p))
    p.write_text("{not json")
    with pytest.raises(stratacl.ConfigError, match="not valid JSON"):
        load_topology(str(p))
    with pytest.raises(stratacl.ConfigError, match="no such file"):
        load_topology(str(tmp_path / "missing.json"))


def test_operations_show_their_signatures_and_docs():
    """Every operation's signature shows the keywords the ``collective`` decorator adds
    (runtime/pipeline/_work.py), native methods (runtime/_replay.c) included; the native ones show the
    Python operation's docstring."""
    import inspect
    from stratacl.runtime.communicator import Communicator
    keywords = "*, async_op: 'bool' = False, path: 'str | None' = None"
    expected = {
        "barrier": "(self, /, *, async_op=False, path=None)",
        "all_gather": f"(self, out: 'np.ndarray', x: 'np.ndarray', {keywords}) -> 'None'",
        "all_to_all": f"(self, out: 'np.ndarray', x: 'np.ndarray', {keywords}) -> 'None'",
        "all_to_all_v": f"(self, out: 'np.ndarray', x: 'np.ndarray', send_counts: 'Sequence[int]', "
                        f"recv_counts: 'Sequence[int]', {keywords}) -> 'None'",
        "broadcast": f"(self, x: 'np.ndarray', root: 'int' = 0, {keywords}) -> 'None'",
        "reduce_scatter": f"(self, out: 'np.ndarray', x: 'np.ndarray', op: 'str' = 'sum', {keywords}) -> 'None'",
        "all_reduce": f"(self, x: 'np.ndarray', op: 'str' = 'sum', {keywords}) -> 'None'",
        "split": f"(self, color: 'int | None', key: 'int' = 0, {keywords}) -> 'Communicator | None'",
        "gather": f"(self, out: 'np.ndarray | None', x: 'np.ndarray', root: 'int' = 0, {keywords}) -> 'None'",
        "scatter": f"(self, out: 'np.ndarray', x: 'np.ndarray | None', root: 'int' = 0, {keywords}) -> 'None'",
        "send": f"(self, x: 'np.ndarray', dst: 'int', {keywords}) -> 'None'",
        "recv": f"(self, x: 'np.ndarray', src: 'int', {keywords}) -> 'None'",
        "sendrecv": f"(self, x: 'np.ndarray', dst: 'int', out: 'np.ndarray', src: 'int', {keywords}) -> 'None'",
    }
    for name, signature in expected.items():
        op = getattr(Communicator, name)
        assert str(inspect.signature(op)) == signature, name
        if not inspect.isfunction(op):          # native: _replay.c; its Python operation is __wrapped__
            python_op = Communicator._barrier if name == "barrier" else op.__wrapped__
            assert op.__doc__ and op.__doc__.splitlines()[0] == python_op.__doc__.splitlines()[0], name


def _documented(obj) -> bool:
    if inspect.ismemberdescriptor(obj):          # a __slots__ entry: its doc is in a dict __slots__
        doc = inspect.getdoc(obj)
    else:
        doc = getattr(obj, "__doc__", None)
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return False                              # the signature dataclasses writes when there is none
    return bool(doc and doc.strip())


def _public_members(cls, inherited: bool):
    """Public methods, properties and slots of ``cls`` (``inherited``: from its bases too)."""
    names = dir(cls) if inherited else list(vars(cls))
    for name in names:
        if name.startswith("_") or (inherited and name in dir(object)):
            continue
        obj = inspect.getattr_static(cls, name)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if callable(obj) or isinstance(obj, property) or inspect.ismemberdescriptor(obj):
            yield name, obj


def test_every_public_name_has_a_docstring():
    """trio's test_exports walks the exports; here each one, and each public method, property
    or slot of the exported classes (Communicator and Work with their bases' ones), must say
    what it is."""
    from stratacl.runtime.pipeline import Work
    missing = []
    classes = []
    for module in (stratacl, stratacl.ub, stratacl.ep, stratacl.shmem):
        assert _documented(module), module.__name__
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.ismodule(obj) or callable(obj)):
                continue                          # data (SETTINGS, config): documented in docs/reference.md's tables
            if not _documented(obj):
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(obj):
                classes.append((f"{module.__name__}.{name}", obj, obj is stratacl.Communicator))
    classes.append(("Work", Work, True))
    for label, cls, inherited in classes:
        missing += [f"{label}.{name}" for name, obj in _public_members(cls, inherited) if not _documented(obj)]
    assert missing == []


def test_one_sided_front_end_is_public_and_curated():
    assert {"shmem", "OneSidedError", "SignalTimeout"} <= set(stratacl.__all__)
    public = {n for n in dir(stratacl.shmem) if not n.startswith("_")}
    assert public == set(stratacl.shmem.__all__)
    assert {"put", "get", "put_signal", "wait_until", "quiet", "fence", "barrier_all", "atomic_fetch_add",
            "atomic_compare_swap"} <= public
    assert issubclass(stratacl.OneSidedError, stratacl.StrataError)
    assert issubclass(stratacl.SignalTimeout, stratacl.OneSidedError) and issubclass(stratacl.SignalTimeout, TimeoutError)
    # what the front ends may use of the runtime: its package's public names
    assert {"SymmetricHeap", "address_of"} <= set(dir(stratacl.runtime))
