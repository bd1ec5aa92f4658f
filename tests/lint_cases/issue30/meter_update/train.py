# msn (judge 19, M4): a CUDA tensor handed every step to a project meter whose update()
# compares it (`max(val, self.max)`, `val > self.best`) is a host sync at the call site.
import torch
import torch.nn as nn
from meters import AverageMeter, BestMeter, SumMeter
from torch.nn.parallel import DistributedDataParallel


def main():
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    maxp_meter = AverageMeter()
    best_meter = BestMeter()
    sum_meter = SumMeter()
    for step in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(torch.randn(4, 8, device="cuda"))
            loss = out.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        max_t = out.max(dim=1).values.mean().detach()
        maxp_meter.update(max_t)  # expect: GD301
        best_meter.update(loss.detach())  # expect: GD301
        sum_meter.update(loss.detach())
        maxp_meter.update(step)
        if step % 100 == 0:
            best_meter.update(max_t)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
