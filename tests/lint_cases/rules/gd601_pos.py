import torch


def train(model, loader, optimizer):
    model = model.cuda()
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()  # expect: GD601
        optimizer.step()
