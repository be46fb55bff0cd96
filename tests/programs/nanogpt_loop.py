"""A nanoGPT-style training loop, knowing nothing of `launch`: its own get_batch (no DataLoader), a tiny
transformer, DDP over gloo, gradient accumulation divided into the loss, ``iter N: loss L, time T ms`` prints."""

import gc
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, BATCH, ACCUM, ITERS = 64, 16, 4, 2, 12


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.block = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, idx, targets):
        logits = self.head(self.block(self.embed(idx)))
        return logits, F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def get_batch():
    data = torch.randint(0, VOCAB, (BATCH, BLOCK + 1))
    return data[:, :-1], data[:, 1:]


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = nn.parallel.DistributedDataParallel(TinyGPT())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for it in range(ITERS):
        t0 = time.time()
        for micro in range(ACCUM):
            model.require_backward_grad_sync = micro == ACCUM - 1
            x, y = get_batch()
            _, loss = model(x, y)
            loss = loss / ACCUM
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(f"iter {it}: loss {loss.item() * ACCUM:.4f}, time {(time.time() - t0) * 1000:.2f}ms", flush=True)
    # as PyTorch asks: the model freed, then the group (left to exit, gloo aborted rank 1 now and then: SIGABRT)
    dist.barrier()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
