"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as PyTorch's own examples write it, knowing nothing of `launch`:
each Linear sharded, then the model; a DataLoader with a DistributedSampler; 12 optimizer steps."""

import gc

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(loader, 1):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step == 12:
            break
    dist.barrier()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
