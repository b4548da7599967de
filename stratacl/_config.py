"""Settings: one typo-proof object, filled from ``STRATACL_*`` environment variables.

Every launcher flag maps to one environment variable, so a rank sees the same settings however
it was started. ``SETTINGS`` is the single table of names, types, defaults and effects; the
The settings table of docs/reference.md is generated from it (``python -m stratacl._config``).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable

from ._errors import ConfigError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:  # noqa: D401
    """Parse '4G', '512MiB', '64K' or a plain byte count; K/M/G/T are powers of 1024."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ConfigError(f"not a size: {text!r} (examples: 4096, 64K, 512M, 4G)")
    value, unit = float(m.group(1)), m.group(2).lower()
    return int(value * 1024 ** " kmgt".index(unit or " "))


def parse_chunk_size(text: str | int) -> int:
    """A size that is a positive multiple of 4 KiB (what can be mapped on its own)."""
    n = parse_size(text)
    if n <= 0 or n % 4096:
        raise ConfigError(f"expected a positive multiple of 4K (4096 bytes), got {text!r}")
    return n


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        v = str(text).strip().lower()
        if v not in allowed:
            raise ConfigError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return v
    parse.__name__ = "|".join(allowed)
    return parse


def _bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    v = str(text).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"expected a boolean (1/0, true/false), got {text!r}")


def _float(text: str | float) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"expected a number, got {text!r}") from None


def _int(text: str | int) -> int:
    try:
        return int(str(text), 0)
    except ValueError:
        raise ConfigError(f"expected an integer, got {text!r}") from None


def _at_least(parse: Callable[[Any], Any], low: float, strict: bool) -> Callable[[Any], Any]:
    """``parse``, then refuse a value below ``low`` (or equal to it, when ``strict``) and NaN."""
    def bounded(text: Any) -> Any:
        v = parse(text)
        if not (v > low if strict else v >= low):        # NaN fails both
            raise ConfigError(f"expected a number {'>' if strict else '>='} {low:g}, got {text!r}")
        return v
    bounded.__name__ = parse.__name__
    return bounded


def _positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return _at_least(parse, 0, strict=True)


def _nonnegative(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return _at_least(parse, 0, strict=False)


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    flag: str | None
    doc: str

    @property
    def env(self) -> str:
        return "STRATACL_" + self.name.upper()

    @property
    def type_name(self) -> str:
        names = {"parse_size": "size", "parse_chunk_size": "size", "_float": "float", "_int": "int", "_bool": "bool", "str": "str"}
        name = getattr(self.parse, "__name__", "str")
        return names.get(name, name)


SETTINGS: tuple[Setting, ...] = (
    Setting("topology", str, "cm384", "--topology",
            "Where ranks sit and what each fabric tier costs: `cm384`, `flat`, or a path to a topology file."),
    Setting("hbm_size", _positive(parse_size), 4 * 1024**3, "--hbm-size",
            "Capacity of each rank's HBM segment (sparse: only touched pages use host memory)."),
    Setting("timeout", _positive(_float), 120.0, "--timeout",
            "Seconds any wait inside an operation may last before CommTimeout; a dead peer is reported sooner. "
            "Also how long the launcher lets the last rank run unfinalized after every other rank finished "
            "before it names it hung and ends it."),
    Setting("registration", _choice("roa", "jit", "pool", "staged"), "roa", "--registration",
            "How buffers become remotely accessible: registration-on-allocation, just-in-time at first use, "
            "one pre-registered pool, or `staged` (the buffer-centric baseline: every input and output is "
            "copied through a registered communication buffer)."),
    Setting("clock", _choice("off", "virtual", "throttled"), "off", "--clock",
            "Modeled time: `off` (no model, full host speed), `virtual` (a per-rank modeled clock advanced by "
            "the fabric model, deterministic) or `throttled` (virtual, and wall time is slowed to follow it "
            "times `dilation`). `comm.clock()` reads it in seconds; with `off` it returns None."),
    Setting("dilation", _positive(_float), 1000.0, "--dilation",
            "With `--clock throttled`: wall seconds per modeled second."),
    Setting("algo", _choice("mesh", "ring", "auto"), "mesh", "--algo",
            "Algorithm of all_gather, reduce_scatter and all_reduce: full mesh (one logical step), ring "
            "(N-1 steps per phase) or `auto` (picked per call by the fabric model's cost estimate)."),
    Setting("cores", _positive(_int), 48, "--cores",
            "Logical NPU cores per rank in the fabric model (cm384: 48 vector cores per die)."),
    Setting("comm_cores", _positive(_int), 24, "--comm-cores",
            "How many of a rank's cores a communication kernel uses; they are partitioned over its transfer units."),
    Setting("partition", _choice("naive", "balanced"), "balanced", "--partition",
            "Core partitioning of transfer units: `naive` (each peer pinned to a fixed core group) or `balanced` "
            "(LPT list scheduling under a per-tier fan-out cap)."),
    Setting("path", _choice("mte", "sdma", "auto"), "mte", "--path",
            "Who moves each phase's copies, for real and in the model: the cores (`mte`), or the rank's SDMA engine "
            "fed by descriptors the cores post (`sdma`; reductions stay on the cores), or `auto`: the cores for "
            "blocking calls, SDMA for asynchronous ones (`async_op=True`), which overlap the program's compute. "
            "Per call: `path=`."),
    Setting("profile", str, "", "--profile",
            "Directory for per-core profiler traces (Chrome trace-event JSON, opens in Perfetto); empty: off."),
    Setting("trace", str, "", "--trace",
            "Directory for per-rank traces of the calls in modeled time (needs `--clock virtual`), which "
            "`stratacl.ub.replay` times again without ranks, also at other rank counts; empty: off."),
    Setting("metadata_path", _choice("direct", "relay"), "direct", "--metadata-path",
            "How registration metadata travels: written by the owner into every peer's mailbox ring, "
            "or relayed by the bootstrap daemon."),
    Setting("pool_size", _nonnegative(parse_size), 0, "--pool-size",
            "Size of the pre-registered region in `pool` mode; 0 means the whole HBM."),
    Setting("allocator", _choice("expandable", "caching"), "expandable", "--allocator",
            "How a rank's HBM allocator gets memory, as PyTorch's with and without `expandable_segments`: "
            "`expandable` (each pool reserves an address range and maps `chunk_size` chunks of HBM into it as "
            "it grows; each chunk mapped is registered on its own) or `caching` (fixed segments, cached). "
            "`pool` registration always uses `caching`."),
    Setting("chunk_size", parse_chunk_size, 2 * 1024**2, "--chunk-size",
            "Granularity of the `expandable` allocator: HBM is mapped, registered and released in chunks "
            "of this size (a multiple of 4K)."),
    Setting("tag_output", _bool, False, "--tag-output",
            "Prefix every line a rank prints with `[rank]`."),
    Setting("debug", _choice("off", "info", "detail"), "off", None,
            "Logging level of the library: OFF, INFO or DETAIL (DETAIL logs every operation and its descriptor)."),
    Setting("grace", _nonnegative(_float), 5.0, "--grace",
            "Seconds the launcher waits after the first failure before SIGTERM, and again before SIGKILL."),
    Setting("deadline", _nonnegative(_float), 0.0, "--deadline",
            "Wall-clock limit for the whole job in seconds; 0 means none. The launcher ends the job when it passes."),
    Setting("emulate_hosts", _positive(_int), 1, "--emulate-hosts",
            "Split the job's ranks into this many emulated hosts (contiguous blocks of ranks): each host has "
            "its own control segment and launcher, no rank maps another host's segments, and what crosses "
            "hosts goes through MPI, one carrier per host (needs the `cluster` extra; docs/cluster.md)."),
    Setting("shared_hosts", _bool, False, "--shared-hosts",
            "Under --emulate-hosts, run the emulated hosts in this machine's namespaces (one /dev/shm, one "
            "loopback) instead of network, IPC and mount namespaces of their own; also what a job falls back "
            "to where namespaces cannot be made (docs/cluster.md)."),
    Setting("va_base", _positive(_int), 0x1000_0000_0000, None,
            "Start of the shared virtual-address window every rank reserves (advanced)."),
)

_BY_NAME = {s.name: s for s in SETTINGS}


class Config:
    """Resolved settings. Attribute access only for known names; assignment is validated."""

    __slots__ = ("_values",)

    def __init__(self, environ: dict[str, str] | None = None, **overrides: Any):
        environ = os.environ if environ is None else environ
        values = {}
        for s in SETTINGS:
            raw = environ.get(s.env)
            try:
                values[s.name] = s.default if raw is None else s.parse(raw)
            except ConfigError as e:
                raise ConfigError(f"{s.env}={raw!r}: {e}") from None
        object.__setattr__(self, "_values", values)
        for k, v in overrides.items():
            setattr(self, k, v)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(_unknown(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _BY_NAME:
            raise ConfigError(_unknown(name))
        try:
            self._values[name] = _BY_NAME[name].parse(value)
        except ConfigError as e:
            raise ConfigError(f"{name}={value!r}: {e}") from None

    def as_env(self) -> dict[str, str]:
        """The environment variables that reproduce these settings in another process."""
        out = {}
        for s in SETTINGS:
            v = self._values[s.name]
            out[s.env] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"


def _unknown(name: str) -> str:
    import difflib
    near = difflib.get_close_matches(name, _BY_NAME, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"unknown setting {name!r}{hint} (known: {', '.join(_BY_NAME)})"


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Reject STRATACL_* variables that name no setting: a typo must not be silently ignored."""
    environ = os.environ if environ is None else environ
    internal = {"STRATACL_JOB_ID", "STRATACL_RANK", "STRATACL_WORLD_SIZE", "STRATACL_BOOT",
                "STRATACL_LAUNCHER_PID", "STRATACL_NPROCS",
                "STRATACL_JOB_SECRET", "STRATACL_STORE",    # the job's store: stratacl/torch/_store.py
                "STRATACL_TEST_HOST_MEMORY",   # a test hook: stratacl/jobs/_memory.py
                "STRATACL_TEST_JOB_TAG"}       # a test hook: stratacl/runtime/memory/_names.py
    known = {s.env for s in SETTINGS} | internal
    for key in environ:
        if key.startswith("STRATACL_") and key not in known:
            near = [s.env for s in SETTINGS if s.env.startswith(key[:12])]
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ConfigError(f"unknown environment variable {key}{hint}")


def settings_table() -> str:
    """The markdown table of every setting, as printed in docs/reference.md."""
    rows = ["| setting | launcher flag | environment variable | type | default | effect |",
            "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = s.default
        if s.type_name == "size" and default:
            unit = next(u for u in "GMK" if default % 1024 ** (" KMG".index(u)) == 0)
            default = f"{default // 1024 ** ' KMG'.index(unit)}{unit}"
        elif s.name == "va_base":
            default = hex(default)
        rows.append(f"| `{s.name}` | {f'`{s.flag}`' if s.flag else '-'} | `{s.env}` | {s.type_name} | "
                    f"`{default}` | {s.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(settings_table())
