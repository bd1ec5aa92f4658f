# improved-diffusion's logger: ranks > 0 write to a file of their own, never to the console.
import os
import sys

_OUT = [sys.stdout]


def configure(dir):
    rank = int(os.environ.get("RANK", 0))
    if rank > 0:
        _OUT[:] = [open(os.path.join(dir, f"log-rank{rank:03d}.txt"), "a")]  # noqa: SIM115


def log(*args):
    for out in _OUT:
        print(*args, file=out)
