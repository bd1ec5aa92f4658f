from torch.utils.data import DataLoader


def train(model, dataset, optimizer, device="cuda"):
    loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)
    for x, y in loader:
        x = x.to(device)  # expect: GD205
        y = y.cuda()  # expect: GD205
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
    it = iter(loader)
    while True:
        batch = next(it)
        inputs = batch["input_ids"].to(device)  # expect: GD205
        model(inputs).sum().backward()


def evaluate(model, val_set, device="cuda"):
    # this loader does not pin memory: non_blocking would not help, nothing to report here
    val_loader = DataLoader(val_set, batch_size=64, num_workers=4)
    for x, y in val_loader:
        model(x.to(device)).argmax(1).eq(y.to(device)).sum().backward()
