import torch
import torch.nn as nn
from cache import ConfidenceSet
from torch.utils.data import DataLoader
from utils.training import finetune_epoch, inference_epoch, train_epoch


def main():
    torch.manual_seed(0)
    device = torch.device("cuda")
    graphs = [torch.load(f"complexes/{i}.pt") for i in range(512)]
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_loader = DataLoader(graphs, batch_size=16, shuffle=True, pin_memory=True)
    scored = ConfidenceSet(graphs[:64], model, device)
    for epoch in range(100):
        train_epoch(model, train_loader, optimizer, device)
        finetune_epoch(model, graphs[:32], optimizer, device)
        if (epoch + 1) % 5 == 0:
            print(epoch, inference_epoch(model, graphs[:20], device, samples=4))
    torch.save({"model": model.state_dict(), "n": len(scored)}, "model.pt")


if __name__ == "__main__":
    main()
