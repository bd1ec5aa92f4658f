# msn (judge 19, M3): `criterion = init_loss()` in main(), called inside the step closure
# `train_step` that the loop hands to a timer: the factory's nested loss runs every step.
import torch
import torch.nn as nn
from losses import init_loss
from torch.nn.parallel import DistributedDataParallel


def gpu_timer(closure):
    result = closure()
    return result, 0.0


def main():
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    criterion = init_loss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for _ in range(100):
        x = torch.randn(4, 8, device="cuda")

        def train_step(x=x):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, logs = criterion(model(x), torch.softmax(x, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach(), logs

        history.append(gpu_timer(train_step))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
