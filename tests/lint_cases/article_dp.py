"""DataParallel training, as in the article: one process drives every GPU."""

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10))

    def forward(self, x):
        return self.layers(x)


dataset = TensorDataset(torch.randn(10_000, 1024), torch.randint(0, 10, (10_000,)))
loader = DataLoader(dataset, batch_size=256, shuffle=True)  # expect: GD204

model = Net()
if torch.cuda.device_count() > 1:
    print("Let's use", torch.cuda.device_count(), "GPUs!")
    model = nn.DataParallel(model)  # expect: GD101
model.to(device)

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

for epoch in range(10):
    running_loss = 0.0
    for inputs, labels in loader:
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()  # expect: GD601
        optimizer.step()
        running_loss += loss.item()  # expect: GD301
    print(f"epoch {epoch}: loss {running_loss / len(loader):.3f}")
