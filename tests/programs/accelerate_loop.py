"""A training loop with Hugging Face Accelerate, knowing nothing of `launch`: ``Accelerator().prepare``,
``accelerator.backward``, gradient accumulation of 2 by Accelerate; 12 optimizer steps."""

import gc

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    steps = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
            accelerator.print(f"step {steps} loss {loss.item():.4f}")
            if steps == 12:
                break
    accelerator.wait_for_everyone()  # as PyTorch asks: the model freed, then the group (end_training destroys it);
    del model, optimizer, loader     # left to exit, gloo aborted rank 1 (SIGABRT) in one fresh-clone run
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
