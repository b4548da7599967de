"""``stratacl-launch``: start N ranks of a script or module on this host.

    stratacl-launch -n 32 [--topology cm384|flat|FILE] [--hbm-size 4G] [--timeout SEC]
                    [--registration roa|jit|pool] [--tag-output] script.py [args...]
    stratacl-launch -n 8 -m package.module [args...]
    stratacl-launch -n 64 --hosts h1:32,h2:32 script.py       (or --hostfile FILE; docs/cluster.md)

Every flag also has a STRATACL_* environment variable (see the README's settings table);
a flag wins over the variable.
"""
from __future__ import annotations

import argparse
import os
import sys

from stratacl import SETTINGS, Config, ConfigError
from stratacl.jobs import Job, check_environment, format_failure, hosts_refusal, launch_on_hosts, parse_hosts, preflight


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stratacl-launch", description="Run a script on N emulated supernode ranks (one process each).",
        epilog="Settings: every flag also reads STRATACL_<NAME> from the environment.")
    p.add_argument("-n", "--nprocs", type=int, default=os.environ.get("STRATACL_NPROCS", "1"),
                   help="number of ranks (STRATACL_NPROCS; default 1)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module as __main__ in each rank")
    p.add_argument("--hosts", metavar="H1:N1,H2:N2", help="run the ranks on these hosts, N1 on H1 and so on, "
                   "one launcher per host started by mpirun (the cluster extra; docs/cluster.md)")
    p.add_argument("--hostfile", metavar="FILE", help="as --hosts, one 'HOST slots=N' (or HOST:N) per line")
    for s in SETTINGS:
        if s.flag is None:
            continue
        if s.parse.__name__ == "_bool":
            p.add_argument(s.flag, dest=s.name, action="store_true", default=None, help=s.doc)
        else:
            p.add_argument(s.flag, dest=s.name, default=None, metavar=s.name.upper(), help=f"{s.doc} ({s.env})")
    p.add_argument("script", nargs="?", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script or module")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        check_environment()
        config = Config()
        for s in SETTINGS:
            value = getattr(ns, s.name) if s.flag else None
            if value is not None:
                try:
                    value = s.parse(value)
                except ConfigError as e:
                    raise ConfigError(f"{s.flag} {value}: {e}") from None
                setattr(config, s.name, value)
    except ConfigError as e:
        print(f"stratacl-launch: {e}", file=sys.stderr)
        return 2
    if ns.module:
        args = ([ns.script] if ns.script else []) + ns.args
        target = ("module", ns.module, [ns.module, *args])
    elif ns.script:
        target = ("script", ns.script, [ns.script, *ns.args])
    else:
        print("stratacl-launch: give a script or -m MODULE", file=sys.stderr)
        return 2
    if ns.nprocs < 1:
        print(f"stratacl-launch: -n must be at least 1, got {ns.nprocs}", file=sys.stderr)
        return 2
    try:
        preflight(ns.nprocs, config)
    except ConfigError as e:
        print(f"stratacl-launch: {e}", file=sys.stderr)
        return 2
    hosts = None
    if ns.hosts and ns.hostfile:
        print("stratacl-launch: give --hosts or --hostfile, not both", file=sys.stderr)
        return 2
    try:
        if ns.hostfile:
            with open(ns.hostfile) as f:
                hosts = parse_hosts(f.read())
        elif ns.hosts:
            hosts = parse_hosts(ns.hosts)
    except (OSError, ValueError) as e:
        print(f"stratacl-launch: {'--hostfile' if ns.hostfile else '--hosts'}: {e}", file=sys.stderr)
        return 2
    why = hosts_refusal(ns.nprocs, config, hosts)
    if why:
        print(f"stratacl-launch: {why}", file=sys.stderr)
        return 2
    if hosts is not None or config.emulate_hosts > 1:
        return launch_on_hosts(ns.nprocs, config, target, hosts)
    outcome = Job(ns.nprocs, config, target, handle_signals=True).run()
    if not outcome.ok:
        print(format_failure(outcome), file=sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
