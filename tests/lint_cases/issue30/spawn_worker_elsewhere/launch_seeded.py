"""The same launch, but the worker seeds every generator itself: nothing to report."""

import torch
import torch.multiprocessing as mp
from utils.seeded import run

if __name__ == "__main__":
    torch.manual_seed(0)
    mp.spawn(run, nprocs=torch.cuda.device_count(), args=(0,))
