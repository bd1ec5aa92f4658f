import torch
import utils


def train_linear(linear, features, loader, optimizer):
    for batch in loader:
        images, target = utils.to_device(batch)
        loss = torch.nn.functional.cross_entropy(linear(features(images)), target)
        loss.backward()  # expect: GD601
        optimizer.step()
