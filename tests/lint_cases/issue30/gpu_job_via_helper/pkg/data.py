from torch.utils.data import DataLoader


def load_data(dataset, batch_size):
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=1)  # expect: GD204
    while True:
        yield from loader
