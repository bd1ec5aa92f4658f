"""Eighteenth judge, M3: the non-final micro-step's backward sits in the `else` of the
accumulation test (`if n_iter % accumulate == 0: backward; step else: backward`): every
micro-step is all-reduced. A GAN schedule (`if it % d_iters == 0: backward; step` with no
backward in the else) accumulates nothing (the control, in `gan_step`)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def gan_step(model, opt_g, opt_d, it, d_iters, x):
    loss_d = model(x).mean()
    loss_d.backward()
    opt_d.step()
    if it % d_iters == 0:
        loss_g = -model(x).mean()
        loss_g.backward()
        opt_g.step()


def main(accumulate_gradients=4):
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for n_iter in range(100):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(8, 4, device="cuda")).sum()
        if n_iter % accumulate_gradients == 0:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        else:
            scaler.scale(loss).backward()  # expect: GD602
    for it in range(100):
        gan_step(model, opt, opt, it, 5, torch.randn(8, 4, device="cuda"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
