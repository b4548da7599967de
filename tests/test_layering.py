"""Packages depend one way, like the floors of a house (docs/architecture.md, "The data path from `ls`").

Every module under ``stratacl/`` and ``launcher/`` (installed as ``stratacl_launcher``) is parsed
with ``ast``, nothing is imported; every import counts, at the top of a module or inside a
function, relative ones resolved. The floors, from the bottom:

    stratacl          the base: _config, _errors, _sizes, _operators (the library's top-level modules)
    collectives, sdma slices, schedules, partitioner, kernels; the SDMA engine and its model
    ub                the fabric and its model (no mechanism: the runtime's registration unit
                      serves ub.view through ub/_mappings.py)
    runtime, inside a rank, by concept:
      (native)        stratacl.runtime._native: the C layer every runtime package stands on
      services        the control segment, waits, mailbox, flight recorder, trace
      memory          HBM, the shadow window, segments, allocators, the registration unit
      pipeline        the call pipeline and a communicator's components
      communicator    the Communicator and its operators
      hosts           jobs across hosts and under other launchers
      runtime         the rank's Runtime (_world), one-sided access, the runtime's API (__init__)
    jobs              outside the ranks: supervision of a job's processes, the bootstrap daemon
    public face       stratacl/__init__.py and the modules that compose the floors below it
                      for users: _arrays, _estimate (the runtime's model), _spawn
    stratacl.bench, stratacl_launcher   tools on top of the library (the launcher: a command line
                      over jobs)
    stratacl.torch    the torch.distributed backend: uses the public face only; nothing in the
                      library imports it (torch stays optional)

Each package's ``__init__`` is its API: a private module (``_hbm``: its last name starts with
``_``) is imported only from inside its own package (a package's own subpackages included, so
every module may import the base's ``stratacl._errors``, and every runtime package the native
layer ``stratacl.runtime._native``). No package directory holds more than 15 modules.

Import arrows do not show a front end that reaches into a communicator's private parts, so two
rules read the code itself: outside ``stratacl/runtime`` no module touches a private attribute
of the runtime's objects (``comm._protocol``: the call pipeline, runtime/pipeline/_call.py, is
the door), and no module imports a private name (``_deferred``) from another package.
"""
from __future__ import annotations

import ast
import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TREES = {"stratacl": ROOT / "stratacl", "stratacl_launcher": ROOT / "launcher"}
SUBPACKAGES = ("runtime", "ub", "collectives", "sdma", "ep", "fabric", "shmem", "jobs", "bench", "torch")
PUBLIC_FACE = ("_arrays", "_estimate", "_spawn")
PUBLIC = "stratacl (public face)"
# the runtime's packages, from the bottom floor up; its native layer is below them, its face above
RUNTIME_PACKAGES = ("services", "memory", "pipeline", "communicator", "hosts")
RUNTIME_FACE = ("_world", "_onesided")
NATIVE = "stratacl.runtime (native)"
RUNTIME_FLOORS = (NATIVE, *(f"stratacl.runtime.{p}" for p in RUNTIME_PACKAGES), "stratacl.runtime")
MAX_MODULES = 15

# Imports known to break a rule, each with why it is still there. Keep this short: an entry is
# a debt, not a permission.
KNOWN: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for top, base in TREES.items():
        for path in base.rglob("*"):
            if path.suffix not in (".py", ".c") or "build" in path.relative_to(base).parts:
                continue
            rel = path.relative_to(base).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            mods[".".join((top, *rel))] = path
    return mods


MODULES = _modules()


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` statement in ``package`` names, relative ones resolved."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The stratacl / stratacl_launcher modules that module ``name`` imports."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
            # "from X import y" imports X, or X.y when y is a module: then X (whose __init__ runs
            # first, as for any module inside X) is named only to reach it
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
            targets = subs + ([mod] if len(subs) < len(node.names) else [])
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] in TREES)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items() if path.suffix == ".py"}


def package_of(module: str) -> str:
    """The floor a module stands on (the docstring's list)."""
    parts = module.split(".")
    if parts[0] == "stratacl_launcher":
        return "stratacl_launcher"
    if len(parts) > 2 and parts[1] == "runtime":
        if parts[2] in RUNTIME_PACKAGES:
            return f"stratacl.runtime.{parts[2]}"
        return "stratacl.runtime" if parts[2] in RUNTIME_FACE else NATIVE
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return f"stratacl.{parts[1]}"
    if len(parts) == 1 or parts[1] in PUBLIC_FACE:
        return PUBLIC
    return "stratacl"


def in_runtime(floor: str) -> bool:
    return floor in RUNTIME_FLOORS


def _reach_ins(graph=None, known=None) -> list[str]:
    """Imports of a private module from outside its package: ``stratacl.runtime.memory._hbm``
    may be imported by modules of ``stratacl.runtime.memory`` (and of packages inside it) only."""
    found = []
    for src, dst in _edges(graph, known):
        package, _, last = dst.rpartition(".")
        inside = src == package or src.startswith(package + ".")
        if last.startswith("_") and not last.startswith("__") and not inside:
            found.append(f"{src} imports {dst}")
    return found


def _edges(graph=None, known=None):
    graph, known = GRAPH if graph is None else graph, KNOWN if known is None else known
    for src, targets in graph.items():
        for dst in sorted(targets):
            if (src, dst) not in known:
                yield src, dst


def _violations(rule, graph=None, known=None) -> list[str]:
    return [f"{src} imports {dst}" for src, dst in _edges(graph, known) if rule(package_of(src), package_of(dst), dst)]


def _stale(known, graph) -> list[str]:
    """KNOWN entries whose import is gone (a debt paid off must leave the list)."""
    return [f"{src} no longer imports {dst}: remove it from KNOWN" for src, dst in known
            if dst not in graph.get(src, ())]


def test_the_graph_was_read():
    assert {"stratacl.runtime._world", "stratacl.runtime.memory._registration", "stratacl.jobs._supervisor",
            "stratacl_launcher._cli", "stratacl.runtime.memory", "stratacl.collectives"} <= set(GRAPH)
    assert {"stratacl.ub", "stratacl.runtime.memory", "stratacl.runtime._native"} <= GRAPH["stratacl.runtime._world"]
    assert "stratacl.runtime._native" in GRAPH["stratacl.runtime.memory._hbm"]     # a C extension, by name
    assert "stratacl.runtime.memory._window" in GRAPH["stratacl.runtime.memory._hbm"]


def test_known_exceptions_still_exist():
    # a debt paid off must leave the list, so the rule it excused applies again
    assert _stale(KNOWN, GRAPH) == []
    assert all(why.strip() for why in KNOWN.values()), "every KNOWN entry says why it is there"


def test_the_checks_see_a_planted_violation_and_only_known_ones_are_excused():
    # KNOWN is empty, so nothing above exercises the excuse or the staleness check: a small
    # graph with an import the rules forbid, and a KNOWN entry for it
    planted = {"stratacl.ub._clock": {"stratacl.ub._topology", "stratacl.runtime._world"}}
    paid_off = {"stratacl.ub._clock": {"stratacl.ub._topology"}}
    fabric_rule = lambda s, d, _: s == "stratacl.ub" and d == "stratacl.runtime"   # noqa: E731
    assert _violations(fabric_rule, planted) == ["stratacl.ub._clock imports stratacl.runtime._world"]
    excused = {("stratacl.ub._clock", "stratacl.runtime._world"): "planted by this test"}
    assert _violations(fabric_rule, planted, excused) == []
    assert _stale(excused, planted) == []
    assert _stale(excused, paid_off) == ["stratacl.ub._clock no longer imports stratacl.runtime._world: "
                                         "remove it from KNOWN"]


def test_the_library_never_imports_the_launcher():
    assert _violations(lambda s, d, _: s != "stratacl_launcher" and d == "stratacl_launcher") == []


def test_nothing_in_the_library_imports_its_benchmark_tool():
    assert _violations(lambda s, d, _: s != "stratacl.bench" and d == "stratacl.bench") == []


def test_the_torch_backend_is_a_user_of_the_public_face_only():
    # `import stratacl` must never import torch, and the backend maps torch onto public calls
    # stratacl.bench is the exception: a tool over the library, whose --api torch measures the
    # backend (imported inside its ranks only, when asked)
    assert _violations(lambda s, d, _: s not in ("stratacl.torch", "stratacl.bench") and d == "stratacl.torch") == []
    assert _violations(lambda s, d, _: s == "stratacl.torch" and d not in ("stratacl.torch", PUBLIC)) == []


def test_the_fabric_reads_no_runtime_internals():
    assert _violations(lambda s, d, _: s == "stratacl.ub" and in_runtime(d)) == []


def test_collectives_and_sdma_sit_below_the_runtime_and_the_fabric():
    below = ("stratacl.collectives", "stratacl.sdma")
    assert _violations(lambda s, d, _: s in below and (d == "stratacl.ub" or in_runtime(d))) == []


def test_what_runs_inside_a_rank_does_not_import_job_supervision():
    inside = ("stratacl", "stratacl.ub", "stratacl.collectives", "stratacl.sdma", *RUNTIME_FLOORS)
    assert _violations(lambda s, d, _: s in inside and d == "stratacl.jobs") == []


def test_the_runtime_packages_stand_on_each_other_from_the_bottom():
    # native layer, services, memory, pipeline, communicator, hosts, the runtime's face: none
    # imports a floor above its own
    def up(s, d, _):
        return in_runtime(s) and in_runtime(d) and RUNTIME_FLOORS.index(d) > RUNTIME_FLOORS.index(s)
    assert _violations(up) == []
    assert set(RUNTIME_FLOORS) <= {package_of(m) for targets in GRAPH.values() for m in targets}   # all seen


def test_no_module_imports_another_package_s_private_module():
    # a package's __init__ is its API: other packages import that, never its modules
    assert _reach_ins() == []


def test_the_reach_in_rule_sees_a_planted_one(tmp_path):
    # a small graph: the daemon reaching into services' mailbox module, the runtime's face into
    # memory's; what a package may import (its own modules, an enclosing package's, an API)
    planted = {"stratacl.jobs._daemon": {"stratacl.runtime.services", "stratacl.runtime.services._mailbox",
                                         "stratacl.jobs._resources"},
               "stratacl.runtime.memory._hbm": {"stratacl.runtime._native", "stratacl._errors",
                                                "stratacl.runtime.memory._window"},
               "stratacl.runtime._world": {"stratacl.runtime.memory", "stratacl.runtime.memory._hbm"}}
    assert _reach_ins(planted) == ["stratacl.jobs._daemon imports stratacl.runtime.services._mailbox",
                                   "stratacl.runtime._world imports stratacl.runtime.memory._hbm"]
    excused = {("stratacl.runtime._world", "stratacl.runtime.memory._hbm"): "planted by this test"}
    assert _reach_ins(planted, excused) == ["stratacl.jobs._daemon imports stratacl.runtime.services._mailbox"]
    # and in source text, as the graph reads it: a module imported by name or from inside it
    jobs = tmp_path / "stratacl" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "_planted.py").write_text("from ..runtime.services import _mailbox, Control\n"
                                      "from stratacl.runtime.memory._segments import prefix\n"
                                      "from ..runtime.memory import new_job_id\nfrom . import _wire\n")
    graph = {"stratacl.jobs._planted": _imports("stratacl.jobs._planted", jobs / "_planted.py")}
    assert _reach_ins(graph) == ["stratacl.jobs._planted imports stratacl.runtime.memory._segments",
                                 "stratacl.jobs._planted imports stratacl.runtime.services._mailbox"]


def test_no_package_directory_holds_more_than_15_modules():
    # one concept per package: count its Python and C modules (a package's subpackages are its own)
    counts = collections.Counter(path.parent.relative_to(ROOT).as_posix() for path in MODULES.values())
    assert {folder: n for folder, n in counts.items() if n > MAX_MODULES} == {}
    assert counts["stratacl/runtime"] > 1 and counts["stratacl/runtime/memory"] > 1


def test_the_base_imports_nothing_above_it():
    assert _violations(lambda s, d, _: s == "stratacl" and d != "stratacl") == []


def test_no_cycle_between_packages():
    deps: dict[str, set[str]] = collections.defaultdict(set)
    why: dict[tuple[str, str], str] = {}
    for src, dst in _edges():
        a, b = package_of(src), package_of(dst)
        if a != b:
            deps[a].add(b)
            why.setdefault((a, b), f"{src} -> {dst}")
    cycles = []

    def walk(node, path):
        for nxt in sorted(deps[node]):
            if nxt in path:
                loop = path[path.index(nxt):] + [nxt]
                cycles.append(" -> ".join(loop) + "  (" + "; ".join(
                    why[(x, y)] for x, y in zip(loop, loop[1:])) + ")")
            elif nxt not in seen:
                seen.add(nxt)
                walk(nxt, path + [nxt])

    for start in sorted(deps):
        seen = {start}
        walk(start, [start])
    assert cycles == []


def test_no_cycle_between_modules():
    # a module's import of its own package (``from . import x``) names the package only to
    # reach x; those edges are left out, the rest must form no loop (C sources: see _c_calls)
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    deps = {src: {dst for dst in targets if dst not in packages and dst in GRAPH}
            for src, targets in GRAPH.items() if src not in packages}
    state: dict[str, int] = {}
    loops = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(deps.get(node, ())):
            if state.get(nxt) == 1:
                loops.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(deps):
        if start not in state:
            visit(start, [start])
    assert loops == []


def test_the_native_sources_depend_one_way():
    # the module file makes the extension from all; _replay.c uses the others, never back
    runtime = ROOT / "stratacl" / "runtime"
    replay = (runtime / "_replay.c").read_text()
    replay_defines = {"mesh_call", "mesh_resume", "replay", "p2p_replay", "prepared_method", "set_barrier",
                      "replay_init", "record_methods", "barrier_call"}
    assert all(f"{name}(" in replay or name in replay for name in replay_defines)
    for source in ("_native.c", "_waits.c", "_flightrec.c", "_agree.c", "_p2pcall.c", "_meshcall.c", "_maps.c"):
        text = re.sub(r"/\*.*?\*/", "", (runtime / source).read_text(), flags=re.S)     # code, not comments
        used = sorted(name for name in replay_defines if re.search(rf"\b{name}\b", text))
        assert used == [], f"{source} refers to _replay.c's {used}"


def test_native_sources_stay_small():
    # one concept per file: no C source of the library past 700 lines, no Python module past 600
    big = [f"{p.relative_to(ROOT)}: {len(p.read_text().splitlines())}" for p in (ROOT / "stratacl").rglob("*")
           if p.suffix in (".c", ".py") and len(p.read_text().splitlines()) > (700 if p.suffix == ".c" else 600)]
    assert big == []


def _private_attributes(package: str) -> set[str]:
    """The private names a package's objects carry: ``self._x`` assigned and ``_x`` defined in
    its classes."""
    names = set()
    for name, path in MODULES.items():
        if path.suffix != ".py" or package_of(name) != package:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and isinstance(node.ctx, ast.Store)):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


RUNTIME_PRIVATE = set().union(*(_private_attributes(floor) for floor in RUNTIME_FLOORS))


def _reach_through(source: str, filename: str, own: set[str]) -> list[str]:
    """Accesses in ``source`` to a private attribute of the runtime's objects (``RUNTIME_PRIVATE``)
    on anything but ``self``, ``cls`` or an imported module, unless the module's own package
    defines that name too (``own``: its objects carry their own ``_done``)."""
    tree = ast.parse(source, filename)
    local = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    local |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)} | {"self", "cls"}
    hidden = RUNTIME_PRIVATE - own
    return [f"{filename}:{n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in hidden
            and not (isinstance(n.value, ast.Name) and n.value.id in local)]


def _private_imports(name: str, path: pathlib.Path) -> list[str]:
    """``from <another package's module> import _name``, where ``_name`` is not a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        mod = _from_module(node, package)
        if mod.split(".")[0] not in TREES or package_of(mod) == package_of(name):
            continue
        found += [f"{name} imports {mod}.{a.name}" for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__") and f"{mod}.{a.name}" not in MODULES]
    return found


def test_front_ends_go_through_the_call_pipeline_not_the_communicators_parts():
    found, own = [], {}
    for name, path in MODULES.items():
        package = package_of(name)
        if path.suffix == ".py" and not in_runtime(package):
            if package not in own:                   # every file of the package parsed once, not once a module
                own[package] = _private_attributes(package)
            found += _reach_through(path.read_text(), str(path.relative_to(ROOT)), own[package])
    assert found == []


def test_the_reach_through_rule_sees_a_front_end_that_touches_the_communicator():
    # what stratacl/ep/_buffer.py did before the pipeline: the rule must name each access
    planted = ("def enter(comm, op, e):\n"
               "    comm._protocol.begin(op, {}, error=e)\n"
               "    return comm._rt.clock is not None and comm._executor.bases\n")
    assert {"_protocol", "_rt", "_executor"} <= RUNTIME_PRIVATE
    assert sorted(_reach_through(planted, "planted.py", set())) == [
        "planted.py:2: comm._protocol", "planted.py:3: comm._executor", "planted.py:3: comm._rt"]
    # a front end's own objects may carry a name the runtime uses too
    assert _reach_through(planted, "planted.py", {"_protocol", "_rt", "_executor"}) == []


def test_no_module_imports_a_private_name_of_another_package():
    found = [v for name, path in MODULES.items() if path.suffix == ".py" for v in _private_imports(name, path)]
    assert found == []


def test_the_private_import_rule_sees_one(tmp_path):
    ep = tmp_path / "stratacl" / "ep"
    ep.mkdir(parents=True)
    (ep / "_planted.py").write_text("from ..runtime.pipeline._work import _deferred, Work\n"
                                    "from ..collectives import _ep\n")
    found = _private_imports("stratacl.ep._planted", ep / "_planted.py")
    assert found == ["stratacl.ep._planted imports stratacl.runtime.pipeline._work._deferred"]


def _services_members() -> set[str]:
    tree = ast.parse((ROOT / "stratacl" / "runtime" / "pipeline" / "_services.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RankServices")
    return ({n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
            | {n.name for n in cls.body if isinstance(n, ast.FunctionDef)})


def _rt_uses(path: pathlib.Path) -> set[tuple[str, int]]:
    """``rt.x`` and ``self._rt.x`` in a module: the runtime's members it uses."""
    found = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(n, ast.Attribute):
            continue
        v = n.value
        if (isinstance(v, ast.Name) and v.id == "rt") or (
                isinstance(v, ast.Attribute) and v.attr == "_rt" and isinstance(v.value, ast.Name)):
            found.add((n.attr, n.lineno))
    return found


def test_components_use_the_runtime_through_its_typed_services_only():
    members = _services_members()
    outside = []
    for name, path in MODULES.items():
        if path.suffix != ".py" or name in ("stratacl.runtime._world", "stratacl.runtime.pipeline._services"):
            continue
        if in_runtime(package_of(name)) or package_of(name) == PUBLIC:
            outside += [f"{path.relative_to(ROOT)}:{line}: rt.{attr}" for attr, line in _rt_uses(path)
                        if attr not in members]
    assert outside == []
    assert {"ctl", "reg", "clock", "empty", "model_for"} <= members


def test_the_runtime_provides_every_service():
    tree = ast.parse((ROOT / "stratacl" / "runtime" / "_world.py").read_text())
    runtime = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Runtime")
    has = {n.name for n in runtime.body if isinstance(n, ast.FunctionDef)}
    for n in ast.walk(runtime):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name) \
                and n.value.id == "self":
            has.add(n.attr)
    assert _services_members() - has == set()


def test_the_one_sided_front_end_uses_the_runtime_package_interface_only():
    # stratacl.shmem reaches the runtime through the names stratacl/runtime/__init__.py exports
    # (SymmetricHeap, runtime/_onesided.py), never through its private modules
    assert "stratacl.runtime" in GRAPH["stratacl.shmem._api"]
    assert _violations(lambda s, d, dst: s == "stratacl.shmem" and in_runtime(d)
                       and dst != "stratacl.runtime") == []
