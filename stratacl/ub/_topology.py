"""Topology as data: where each rank sits and what each fabric tier costs.

A topology is a list of nested levels (innermost first) and a tier per level. Two ranks talk
over the tier of the innermost level they share. ``cm384`` is CloudMatrix384 as the StrataCL
paper describes it (2 dies per NPU, 8 NPUs per node, 4 nodes per rack, 12 racks; Table 1 gives
die-to-die 0.2 us / 210 GB/s, intra-node 0.7 us / 170 GB/s, inter-node 2.1 us / 150 GB/s).
Rank r is die r, packed in that order.

A file (JSON) describes other machines::

    {"name": "nvl72-like",
     "levels": [{"name": "gpu", "size": 1, "tier": "local"},
                {"name": "rack", "size": 72, "tier": "nvlink"}],
     "tiers": {"local": {"latency_us": 0.1, "bandwidth_gbps": 2000},
               "nvlink": {"latency_us": 1.0, "bandwidth_gbps": 900}},
     "beyond": "nvlink"}

``size`` is how many units of the previous level one unit of this level holds (the first
level counts ranks). ``beyond`` is the tier between ranks that share no level.
"""
from __future__ import annotations

import dataclasses
import json
import os

from .._errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Tier:
    name: str
    latency_us: float
    bandwidth_gbps: float


@dataclasses.dataclass(frozen=True)
class Level:
    name: str
    size: int          # units of the previous level (ranks for the first) per unit of this one
    tier: str          # tier between two ranks whose innermost shared unit is this level


class Topology:
    def __init__(self, name: str, levels: list[Level], tiers: dict[str, Tier], beyond: str):
        self.name, self.levels, self.tiers, self.beyond = name, levels, tiers, beyond
        self._span = []
        span = 1
        for lv in levels:
            span *= lv.size
            self._span.append(span)

    def location(self, rank: int) -> dict[str, int]:
        """Index of the unit holding ``rank`` at every level, e.g. {'die': 3, 'npu': 1, ...}."""
        return {lv.name: rank // span for lv, span in zip(self.levels, self._span)}

    def tier(self, a: int, b: int) -> Tier:
        """The tier two ranks communicate over (the innermost level they share)."""
        for lv, span in zip(self.levels, self._span):
            if a // span == b // span:
                return self.tiers[lv.tier]
        return self.tiers[self.beyond]

    def describe(self, world: int | None = None) -> str:
        lines = [f"topology {self.name}:"]
        for lv, span in zip(self.levels, self._span):
            t = self.tiers[lv.tier]
            lines.append(f"  {lv.name:<8} {span:>5} rank(s) per unit; tier {t.name}: "
                         f"{t.latency_us:g} us, {t.bandwidth_gbps:g} GB/s")
        if self.beyond:
            t = self.tiers[self.beyond]
            lines.append(f"  beyond   tier {t.name}: {t.latency_us:g} us, {t.bandwidth_gbps:g} GB/s")
        if world is not None:
            lines.append(f"  {world} rank(s) in this job")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Topology({self.name!r})"


_CM384 = {
    "name": "cm384",
    "levels": [
        {"name": "die", "size": 1, "tier": "local"},
        {"name": "npu", "size": 2, "tier": "die-to-die"},
        {"name": "node", "size": 8, "tier": "intra-node"},
        {"name": "rack", "size": 4, "tier": "inter-node"},
        {"name": "supernode", "size": 12, "tier": "inter-node"},
    ],
    "tiers": {
        "local": {"latency_us": 0.0, "bandwidth_gbps": 1600.0},      # die HBM, paper section 2.1
        "die-to-die": {"latency_us": 0.2, "bandwidth_gbps": 210.0},  # Table 1
        "intra-node": {"latency_us": 0.7, "bandwidth_gbps": 170.0},  # Table 1
        "inter-node": {"latency_us": 2.1, "bandwidth_gbps": 150.0},  # Table 1
    },
    "beyond": "inter-node",
}

_FLAT = {
    "name": "flat",
    "levels": [{"name": "rank", "size": 1, "tier": "local"}],
    "tiers": {"local": {"latency_us": 0.0, "bandwidth_gbps": 1600.0},
              "fabric": {"latency_us": 0.7, "bandwidth_gbps": 170.0}},
    "beyond": "fabric",
}


def from_dict(data: dict, source: str = "topology") -> Topology:
    def need(obj, key, kind, where):
        if not isinstance(obj, dict) or key not in obj:
            raise ConfigError(f"{source}: missing field {where}{key!r}")
        value = obj[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"{source}: field {where}{key!r} must be {kind.__name__}, got {value!r}")
        return value

    name = need(data, "name", str, "")
    tiers = {}
    for tname, t in need(data, "tiers", dict, "").items():
        lat = need(t, "latency_us", float, f"tiers.{tname}.")
        bw = need(t, "bandwidth_gbps", float, f"tiers.{tname}.")
        if lat < 0 or bw <= 0:
            raise ConfigError(f"{source}: tiers.{tname} needs latency_us >= 0 and bandwidth_gbps > 0")
        tiers[tname] = Tier(tname, lat, bw)
    levels = []
    for i, lv in enumerate(need(data, "levels", list, "")):
        lname = need(lv, "name", str, f"levels[{i}].")
        size = need(lv, "size", int, f"levels[{i}].")
        tier = need(lv, "tier", str, f"levels[{i}].")
        if size < 1:
            raise ConfigError(f"{source}: field levels[{i}].'size' must be >= 1, got {size}")
        if tier not in tiers:
            raise ConfigError(f"{source}: field levels[{i}].'tier' names unknown tier {tier!r}")
        levels.append(Level(lname, size, tier))
    if not levels:
        raise ConfigError(f"{source}: field 'levels' must not be empty")
    beyond = need(data, "beyond", str, "")
    if beyond not in tiers:
        raise ConfigError(f"{source}: field 'beyond' names unknown tier {beyond!r}")
    return Topology(name, levels, tiers, beyond)


def load(spec: str) -> Topology:
    """``cm384``, ``flat`` or a path to a JSON topology file."""
    if spec == "cm384":
        return from_dict(_CM384)
    if spec == "flat":
        return from_dict(_FLAT)
    if not os.path.exists(spec):
        raise ConfigError(f"topology {spec!r}: not a built-in (cm384, flat) and no such file")
    try:
        with open(spec) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"topology file {spec}: not valid JSON ({e})") from None
    return from_dict(data, source=f"topology file {spec}")
