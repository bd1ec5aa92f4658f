import torch
from pkg import dist_util
from pkg.data import load_data


def main(model, dataset, optimizer):
    model.to(dist_util.dev())
    data = load_data(dataset, batch_size=8)
    for _ in range(10):
        batch = next(data)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch.to(dist_util.dev())).mean()
        loss.backward()
        optimizer.step()
