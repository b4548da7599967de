"""Every rank prints COUNT (argv[1]) numbered lines to stdout and to stderr, alternating, with
``print``: run under PYTHONUNBUFFERED=1, each line is two writes (its text, then its newline)."""
import os
import sys

rank = os.environ["STRATACL_RANK"]
pad = "." * 40          # long enough that a line cut by another rank's bytes shows
for i in range(int(sys.argv[1])):
    print(f"r{rank} out {i} {pad}")
    print(f"r{rank} err {i} {pad}", file=sys.stderr)
