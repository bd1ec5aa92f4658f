import torch
import utils


def train_one_epoch(model, loader, optimizer, log_writer=None):
    metric_logger = utils.MetricLogger()
    for samples, _targets in loader:
        with torch.autocast("cuda"):
            loss = model(samples.cuda(non_blocking=True)).mean()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = loss.item()  # expect: GD301
        metric_logger.update(loss=loss_value)
        if log_writer is not None:
            log_writer.update(loss=loss_value, head="loss")
            log_writer.update(grad_norm=grad_norm, head="opt")
