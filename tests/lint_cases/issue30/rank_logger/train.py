import logging

import logger
import torch
import torch.distributed as dist


def create_logger(output_dir, dist_rank):
    made = logging.getLogger("train")
    if dist_rank == 0:
        made.addHandler(logging.StreamHandler())
    return made


def train(args, model, loader, optimizer):
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl")
    logger.configure(args.output)
    logging.basicConfig(level=logging.INFO)  # the root logger: every rank at INFO
    run_logger = create_logger(args.output, dist_rank=dist.get_rank())
    for x, _ in loader:
        with torch.autocast("cuda"):
            loss = model(x.cuda()).mean()
        loss.backward()
        optimizer.step()
        logger.log("step")
        run_logger.info("step")
        logging.info("step")  # expect: GD702
    dist.destroy_process_group()
