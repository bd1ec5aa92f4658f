import torch
import torch.distributed

import pycls.core.logging as logging

logger = logging.get_logger(__name__)


def train_model(model, loader, optimizer, args):
    torch.cuda.set_device(args.local_rank)
    torch.distributed.init_process_group("nccl")
    torch.manual_seed(0)
    logging.setup_logging()
    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[args.local_rank])
    for _epoch in range(args.epochs):
        for x in loader:
            with torch.autocast("cuda"):
                loss = model(x.cuda(non_blocking=True)).mean()
            loss.backward()
            optimizer.step()
        torch.save(model.state_dict(), "ckpt.pt")  # expect: GD701
        logger.info("Wrote checkpoint")
    torch.distributed.destroy_process_group()
