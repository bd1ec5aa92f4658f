# The same loop without the start-up replacement: every rank prints.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args, model, loader, optimizer):
    torch.cuda.set_device(args.gpu)
    dist.init_process_group("nccl")
    torch.manual_seed(args.seed)
    model = DDP(model.cuda(), device_ids=[args.gpu])
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for images, _target in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(images.cuda(non_blocking=True)).mean()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} done")  # expect: GD702
        print("checkpoint written", force=True)
    dist.destroy_process_group()
