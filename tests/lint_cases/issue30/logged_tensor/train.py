"""Eighteenth judge, M5 (ddim): a CUDA loss handed to `SummaryWriter.add_scalar` every step
is a host sync (TensorBoard calls .item() on it), as are the values of an `add_scalars` or
`wandb.log` dict. A Python number logged, or a tensor logged every N steps, is not; and
GD301 inside an `assert` says to hoist or drop the check (the message test)."""

import torch
import wandb
from torch.utils.tensorboard import SummaryWriter


def main():
    writer = SummaryWriter("runs")
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(100):
        x = torch.randn(8, 4, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).sum()
        writer.add_scalar("loss", loss, global_step=step)  # expect: GD301
        wandb.log({"loss": loss, "step": step})  # expect: GD301
        writer.add_scalar("lr", 0.1, step)
        assert torch.isfinite(x).all().item()  # expect: GD301
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            writer.add_scalars("losses", {"total": loss}, step)


if __name__ == "__main__":
    main()
