# CenterNet's Debugger (thirteenth judge): colours held in an attribute that is only ever a
# numpy array, read with .tolist() per step: host memory, no sync (on CenterNet itself the
# change removed 2 false GD301; this case guards the tensor attribute, still a sync).
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, optimizer, theme="white"):
        self.model, self.optimizer, self.theme = model, optimizer, theme
        colors = [np.array([0, 128, 255]) for _ in range(80)]
        self.colors = np.array(colors, dtype=np.uint8).reshape(len(colors), 1, 1, 3)
        if theme == "white":
            self.colors = self.colors.reshape(-1)[::-1].reshape(len(colors), 1, 1, 3)
            self.colors = np.clip(self.colors, 0.0, 0.6 * 255).astype(np.uint8)
        self.last = torch.zeros(1, device="cuda")

    def run_epoch(self, loader):
        for step, (x,) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = self.model(x.cuda(non_blocking=True)).pow(2).mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            c = self.colors[step % 80][0][0].tolist()
            if self.theme == "white":
                c = (255 - np.array(c)).tolist()
            self.last = loss.detach()
            print(self.last.item())  # expect: GD301 GD702


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(512, 8))
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(
        data, batch_size=4, sampler=sampler, num_workers=2, pin_memory=True
    )
    trainer = Trainer(model, optimizer)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        trainer.run_epoch(loader)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
