# Judge 21, D4: `torch.cuda.empty_cache()` under a switch named for it (Pointcept's
# `if self.cfg.empty_cache:`, False in its base config) is the user's opt-in: no GD302.
# Under another test (`if step > 0:`) GD302 stays.
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, cfg, loader):
        self.cfg = cfg
        self.loader = loader
        self.model = DDP(  # expect: GD403
            torch.nn.Linear(10, 10).cuda(), device_ids=[int(os.environ["LOCAL_RANK"])]
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def run_step(self, batch, step):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(batch.cuda(non_blocking=True)).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.cfg.empty_cache:
            torch.cuda.empty_cache()
        if step > 0 and self.cfg.clear_cache:
            torch.cuda.empty_cache()
        if step > 0:
            torch.cuda.empty_cache()  # expect: GD302

    def train(self):
        torch.manual_seed(0)
        for epoch in range(10):
            self.loader.sampler.set_epoch(epoch)
            for step, batch in enumerate(self.loader):
                self.run_step(batch, step)
