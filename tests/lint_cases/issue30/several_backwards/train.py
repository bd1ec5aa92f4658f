# ddgan's discriminator step (judge 19, M5): the real loss and the fake loss each call
# backward() on the DDP model before one optimizer step: two gradient all-reduces a step.
# A penalty only some steps run does not count; the generator's single backward is fine.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def main(lazy_reg=None):
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    net_d = DistributedDataParallel(nn.Linear(8, 1).cuda(), device_ids=[0])
    net_g = DistributedDataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    opt_d = torch.optim.Adam(net_d.parameters(), lr=1e-4)
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-4)
    for step in range(100):
        real = torch.randn(4, 8, device="cuda", requires_grad=True)
        net_d.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            d_real = net_d(real).view(-1)
            err_real = F.softplus(-d_real).mean()
        err_real.backward(retain_graph=True)  # expect: GD602
        if lazy_reg is not None and step % lazy_reg == 0:
            (grad,) = torch.autograd.grad(d_real.sum(), real, create_graph=True)
            grad.pow(2).sum(1).mean().backward()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fake = net_g(torch.randn(4, 8, device="cuda"))
            err_fake = F.softplus(net_d(fake.detach()).view(-1)).mean()
        err_fake.backward()
        opt_d.step()
        net_g.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            err_g = F.softplus(-net_d(fake).view(-1)).mean()
        err_g.backward()
        opt_g.step()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
