"""Every rank writes COUNT (argv[1]) numbered lines to stdout as fast as it can, then exits."""
import os
import sys

rank = os.environ["STRATACL_RANK"]
sys.stdout.writelines(f"r{rank} line {i}\n" for i in range(int(sys.argv[1])))
