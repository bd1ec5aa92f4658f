import logging

import torch.distributed as dist

log = logging.getLogger(__name__)
logging.basicConfig(level=logging.INFO)  # every rank logs at INFO


def train(model, loader, optimizer, writer):
    dist.init_process_group("gloo")
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        print("step", step)  # expect: GD702
        log.info("loss %s", loss)  # one block with the print above: one finding there
        writer.add_scalar("loss", loss, step)
    dist.destroy_process_group()
