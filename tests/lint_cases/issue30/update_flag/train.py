# microsoft/LoRA's gpt2_ft.py (fourteenth judge): the accumulation test is bound to a
# name in the loop and handed to a helper that runs backward on every call and steps the
# optimizer only when told; GD602 found it only with the `%` written in the call.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def optimizer_step(loss, optimizer, model, is_update=True):
    loss.backward()
    if is_update:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()


def main(grad_acc=4):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(32, 32).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step = 0
    for _ in range(100):
        x = torch.randn(8, 32, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).pow(2).mean()
        train_step += 1  # noqa: SIM113 - the real code's counter
        is_update = True if train_step % grad_acc == 0 else False  # noqa: SIM210 - as written there
        optimizer_step(loss / grad_acc, optimizer, model, is_update=is_update)  # expect: GD602
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
