import torch
import utils


def train_one_epoch(model, loader, optimizer, loss_scaler):
    metric_logger = utils.MetricLogger(delimiter="  ")
    for samples, _targets in loader:
        with torch.autocast("cuda"):
            loss = model(samples.cuda(non_blocking=True)).mean()
        loss_value = loss.item()  # expect: GD301
        grad_norm = loss_scaler(loss, optimizer, parameters=model.parameters())
        metric_logger.update(loss=loss_value)
        metric_logger.update(lr=optimizer.param_groups[0]["lr"])
        metric_logger.update(grad_norm=grad_norm)  # a tensor: the helper's .item() syncs


@torch.no_grad()
def evaluate(model, loader):
    metric_logger = utils.MetricLogger(delimiter="  ")
    for images, target in loader:
        acc = (model(images.cuda()).argmax(1) == target.cuda()).float().mean()
        metric_logger.update(acc=acc)
