from torch import distributed


def train(model, loader, optimizer):
    for batch in loader:
        model(batch).mean().backward()
        optimizer.step()
        distributed.barrier()  # expect: GD703
