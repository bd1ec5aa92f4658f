import torch
import torch.distributed as dist
import utils
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args, model, loader, optimizer):
    utils.init_distributed_mode(args)
    torch.manual_seed(args.seed)
    model = DDP(model.cuda(), device_ids=[args.gpu])
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for images, _target in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(images.cuda(non_blocking=True)).mean()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} done")  # rank 0 only: builtins.print was replaced
    dist.destroy_process_group()
