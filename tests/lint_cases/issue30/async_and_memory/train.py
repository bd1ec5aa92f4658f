import io
import os

import torch
import torch.distributed as dist


def print0(*args):
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args)


def snapshot(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def train(model, loader, optimizer):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    for x, _ in loader:
        with torch.autocast("cuda"):
            loss = model(x.cuda()).mean()
        loss.backward()
        # waited for at once: as synchronous as without async_op
        params = model.parameters()
        handles = [dist.all_reduce(p.grad, async_op=True) for p in params]  # expect: GD704
        for handle in handles:
            handle.wait()
        dist.all_reduce(loss)  # expect: GD704
        optimizer.step()
        print0("step done")
        snapshot(model.state_dict())
        torch.save(model.state_dict(), "last.pt")  # expect: GD701
    dist.destroy_process_group()
