# msn's grad_logger (judge 19, M2): `not (len(p.shape) == 1)` holds for every weight matrix
# on every step, an inequality, not an occasional guard; `not (step % 100)` still is one.
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8, device="cuda")).sum()
        opt.zero_grad()
        loss.backward()
        norms = []
        for _, p in model.named_parameters():
            if not (len(p.shape) == 1):  # noqa: SIM201
                norms.append(float(torch.norm(p.grad)))  # expect: GD301
            if len(p.shape) != 1:
                norms.append(float(torch.norm(p.grad)))  # expect: GD301
        if not (step % 100):
            norms.append(float(loss))
        opt.step()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
