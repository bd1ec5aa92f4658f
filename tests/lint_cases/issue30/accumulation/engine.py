# ConvNeXt-style update_freq through a loss-scaler helper, under DDP, without no_sync.
import torch
import torch.distributed as dist


def train_one_epoch(model, loader, optimizer, loss_scaler, update_freq):
    for it, (samples, _targets) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = model(samples.cuda(non_blocking=True)).mean() / update_freq
        loss_scaler(  # expect: GD602
            loss, optimizer, parameters=model.parameters(), update_grad=(it + 1) % update_freq == 0
        )
    dist.barrier()
