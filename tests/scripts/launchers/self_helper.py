"""A one-process script that runs itself again as a helper (no process group, no
training: `python self_helper.py helper OUT`), then trains a few steps. The helper is
not a rank: it must record nothing. Traced by tests/test_launchers.py as
`gpudiag trace self_helper.py train OUT`."""

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "helper":
        # under gpudiag, the re-executed script runs in gpudiag's worker
        out.write_text(f"helper ran, re-executed by {os.environ.get('GPUDIAG_REEXEC_PARENT')}\n")
        sys.exit(3)
    code = subprocess.run([sys.executable, __file__, "helper", str(out)]).returncode
    assert code == 3, code
    model = nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
