"""Jobs: start a job's rank processes and its bootstrap daemon, supervise them, clean up.

What runs outside the ranks, for both front doors: ``stratacl-launch`` (the
``stratacl_launcher`` package, a command line over ``Job``) and ``stratacl.spawn`` (a Python
call that runs ``Job`` in the caller's process). Inside each rank only ``_rankboot`` runs (in a
rank forked from the template, after the template's few lines that make it the rank).

    _supervisor   Job: segments, daemon, ranks, reports, the first failure, teardown
    _daemon       the bootstrap daemon: relays registration metadata, cleans up after the job
    _template     the rank template: imports the library once, forks the ranks, reports their ends
    _rankboot     every rank process's entry point
    _output       every rank's stdout and stderr, forwarded line by line from one thread
    _memory       host memory: the pre-launch warning, the ranks' footprint, the OOM verdict
    _wire         length-prefixed pickle frames between the supervisor and a rank
    _resources    the sweep of a job's leftover names in /dev/shm
    _preflight    the settings every rank would refuse (topology, address window), checked first
    _hostjob      a job over hosts: the host list, what refuses it, one launcher per host by mpirun
    _processes    finding and ending a job's processes (also the bench's peers)

The names below are what the two front doors (and the bench) use of it.
"""
from .._config import check_environment as check_environment
from ._hostjob import launch as launch_on_hosts
from ._hostjob import parse_hosts as parse_hosts
from ._hostjob import refusal as hosts_refusal
from ._outcome import format_failure as format_failure
from ._preflight import check as preflight
from ._processes import collect as collect_processes
from ._processes import end as end_processes
from ._supervisor import Job as Job

__all__ = ["Job", "check_environment", "collect_processes", "end_processes", "format_failure", "hosts_refusal",
           "launch_on_hosts", "parse_hosts", "preflight"]

# True in a rank while _rankboot imports the spawning script to find the function it runs: a
# stratacl.spawn reached then is the script's own top-level call, and must not start a job
# (_rankboot runs as __main__, so the flag lives here, in a module imported once)
importing_main = False

# In a rank forked from the rank template (_template): the template's pid, the rank's parent;
# 0 in a spawned rank (whose parent is the launcher). Set by the template in the new rank.
forked_from = 0
