# The metric stays on the GPU and is read once after the loop; a loader loop that trains
# through a helper (timm's NativeScaler does backward and step) is a training loop (GD301).
import torch


@torch.no_grad()
def evaluate(model, data_loader):
    model.eval()
    correct = torch.zeros((), device="cuda")
    for images, target in data_loader:
        correct += (model(images.cuda()).argmax(1) == target.cuda()).sum()
    return correct.item()


def train_one_epoch(model, criterion, data_loader, optimizer, loss_scaler):
    model.train()
    for samples, targets in data_loader:
        loss = criterion(model(samples.cuda()), targets.cuda())
        loss_value = loss.item()  # GD301 (a training loop), not GD303
        loss_scaler(loss, optimizer, parameters=model.parameters())
    return loss_value
