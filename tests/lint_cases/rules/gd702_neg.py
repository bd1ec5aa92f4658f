import logging

import torch.distributed as dist

log = logging.getLogger(__name__)


def train(model, loader, optimizer, writer, rank):
    dist.init_process_group("gloo")
    print("starting on rank", rank)  # once, outside the loop
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print("step", step)
            log.info("loss %s", loss)
            writer.add_scalar("loss", loss, step)
    dist.destroy_process_group()
