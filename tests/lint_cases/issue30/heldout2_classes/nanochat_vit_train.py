"""nanochat: GradScaler's found_inf all-reduced so that all ranks skip the same step;
pycls: async_op=True waited at once; ViT-pytorch: an eval loop over tqdm(test_loader)
held in a name; SlowFast: a warning that names its rank."""

import logging
import pickle

import torch
import torch.distributed as dist
from tqdm import tqdm

logger = logging.getLogger(__name__)


def scaled_all_reduce(tensors):
    reductions = []
    for tensor in tensors:
        reduction = dist.all_reduce(tensor, async_op=True)  # expect: GD704
        reductions.append(reduction)
    for reduction in reductions:
        reduction.wait()
    return tensors


def overlapped(grads, model, x):
    work = dist.all_reduce(grads, async_op=True)
    out = model(x)  # compute runs while the reduction is in flight
    work.wait()
    return out


def serialize(data):
    buffer = pickle.dumps(data)
    if len(buffer) > 1024**3:
        logger.warning(f"Rank {dist.get_rank()} trying to all-gather {len(buffer) / 1e9:.2f} GB")
    return buffer


def valid(model, test_loader):
    model.eval()
    losses = []
    epoch_iterator = tqdm(test_loader, desc="Validating...")
    for _step, (x, _y) in enumerate(epoch_iterator):
        with torch.no_grad():
            loss = model(x.cuda()).mean()
        losses.append(loss.item())  # expect: GD303
    return losses


def train(model, loader, optimizer, scaler, args):
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[args.local_rank])
    for x, _y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x.cuda()).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        for v in scaler._found_inf_per_device(optimizer).values():
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
        scaler.step(optimizer)
        scaler.update()
        stats = scaled_all_reduce([loss.detach()])
        overlapped(stats[0], model, x.cuda())
        serialize(stats)
        dist.all_reduce(loss.detach(), op=dist.ReduceOp.MAX)  # expect: GD704
    valid(model, loader)
    dist.destroy_process_group()
