import torch


class Trainer:
    def __init__(self, model, optimizer, loader):
        self.model = model.cuda()
        self.optimizer = optimizer
        self.loader = loader

    def fit(self, epochs):
        for _ in range(epochs):
            for inputs, labels in self.loader:
                loss = self.train_step(inputs.cuda(), labels.cuda())
                print(loss)  # expect: GD301
                preds = self.model(inputs.cuda()).argmax(1).cpu().numpy()  # expect: GD301
                torch.cuda.synchronize()  # expect: GD301
                print(preds.shape)

    def train_step(self, inputs, labels):
        loss = torch.nn.functional.cross_entropy(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.last = loss.item()  # expect: GD301
        return loss


def nested(model, optimizer, loader):
    for _epoch in range(3):
        for step, (x, _y) in enumerate(loader):
            for micro in x.chunk(4):
                loss = (model(micro.cuda()) - 1).pow(2).mean()
                loss.backward()
                history = loss.tolist()  # expect: GD301
            optimizer.step()
            print(f"{step}: {loss}")  # expect: GD301
    return history
