"""Busy Python for argv[1] seconds (a grandchild's work in subwork_job.py)."""

import sys
import time

t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    pass
