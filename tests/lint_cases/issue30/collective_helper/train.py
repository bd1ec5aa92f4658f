# waveglow (judge 19, P3): the loss all-reduced every step by a helper of another file;
# the finding names the helper's collective and the per-step call site.
import torch
import torch.distributed as dist
import torch.nn as nn
from distributed import reduce_tensor
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for _ in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8, device="cuda")).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(reduce_tensor(loss.detach(), 8))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
