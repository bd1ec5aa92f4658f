import os

import torch
import torch.distributed as dist
from models import Backbone, Probe
from torch.nn.parallel import DistributedDataParallel as DDP

grad_norms = []


def grad_norm_hook(module, grad_input, grad_output):
    grad_norms.append(grad_output[0].norm().item())  # expect: GD301


def nan_hook(module, grad_input, grad_output):
    torch.cuda.synchronize()  # expect: GD301


def log_activations(module, inputs, output):
    print(output.abs().max().item())


def count_flops(module, inputs, output):
    print(output.numel(), output.sum().item())


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    dist.init_process_group("nccl")
    model = Backbone().cuda()
    hooks = [grad_norm_hook, nan_hook]
    for h in hooks:
        model.register_full_backward_hook(h)
    if args.log_activations:  # a switch: not followed
        model.register_forward_hook(log_activations)
    # a one-off measurement: registered, one forward, removed
    handle = model.register_forward_hook(count_flops)
    model(torch.randn(1, 4, device="cuda"))
    handle.remove()
    probe = Probe().cuda()
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        x = torch.randn(8, 4, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    probe(torch.randn(8, 4, device="cuda"))
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--log-activations", action="store_true")
    main(parser.parse_args())
