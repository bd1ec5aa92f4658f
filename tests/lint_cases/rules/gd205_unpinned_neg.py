from torch.utils.data import DataLoader


def train(model, dataset, optimizer, device="cuda"):
    # without pinned memory non_blocking would not help (GD204 says so instead)
    loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=False)
    for x, y in loader:
        loss = (model(x.to(device)) - y.to(device)).pow(2).mean()
        loss.backward()
        optimizer.step()
