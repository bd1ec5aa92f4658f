import logging

import torch.distributed as dist

log = logging.getLogger(__name__)


def train(model, loader, optimizer, writer):
    dist.init_process_group("gloo")
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        print("step", step)  # expect: GD702
        log.info("loss %s", loss)  # expect: GD702
        writer.add_scalar("loss", loss, step)  # expect: GD702
    dist.destroy_process_group()
