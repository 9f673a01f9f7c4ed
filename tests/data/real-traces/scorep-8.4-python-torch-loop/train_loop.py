"""A small PyTorch training loop, traced by Score-P's Python bindings with
the instrumenter on for the loop only (python -m scorep --noinstrumenter)."""

import scorep.instrumenter
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 20), torch.randint(0, 3, (256,)))
loader = DataLoader(data, batch_size=64)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.CrossEntropyLoss()
with scorep.instrumenter.enable():
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
print("done")
