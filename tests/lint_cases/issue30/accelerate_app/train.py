from accelerate import Accelerator
from torch.utils.data import DataLoader


def training_function(model, optimizer, dataset):
    accelerator = Accelerator(cpu=False)
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=4)  # expect: GD204
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(3):
        for batch in loader:
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            loss = model(**batch).loss
            accelerator.backward(loss)  # no GD601: the precision is set at accelerate launch
            optimizer.step()
            optimizer.zero_grad()
            print(f"loss {loss.item()}")  # expect: GD301 GD702
        accelerator.print(f"epoch {epoch}")
