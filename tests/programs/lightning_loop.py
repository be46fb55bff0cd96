"""A Lightning program as its docs write one, knowing nothing of `launch`: a LightningModule, a DataLoader, and
``Trainer(strategy="ddp")`` on CPU. Lightning finds torchrun's environment itself and steps its optimizer through
a closure (the forward and the backward run inside ``optimizer.step``); its progress bar is left on. It ends as
PyTorch asks: the trainer and model freed, then ``destroy_process_group()`` (left to exit, gloo aborts a rank now and
then on these loaded machines, as plain_loop.py and nanogpt_loop.py found)."""

import gc

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=12, logger=False,
                        enable_checkpointing=False)
    trainer.fit(Classifier(), DataLoader(data, batch_size=8))
    trainer.strategy.barrier()
    del trainer
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
