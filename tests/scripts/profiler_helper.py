"""A helper module of the script's folder that creates a torch profiler (probe 28d,
defect 9: `import myprof` ... `p = myprof.start()` at step 7 inside an open range)."""

import torch


def start() -> torch.profiler.profile:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.__enter__()
    return prof
