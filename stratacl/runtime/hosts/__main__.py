"""``python -m stratacl.runtime.hosts JOB WORLD HOSTS``: a host's carrier in a process of its own,
one per host under one mpirun (a job torchrun started: runtime/hosts/_foreign.py)."""
import sys

from ._carrier import main

sys.exit(main(sys.argv[1:]))
