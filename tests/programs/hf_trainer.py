"""Hugging Face's Trainer on a tiny GPT-2 built from a config (no download), knowing nothing of `launch`:
the Trainer sets up distributed training itself; 12 optimizer steps of 4 sequences a rank. It ends as PyTorch
asks: the trainer freed, then destroy_process_group()."""

import gc

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, index):
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids.clone()}


def main():
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    args = TrainingArguments(output_dir="hf-out", max_steps=12, per_device_train_batch_size=4, logging_steps=4,
                             report_to=[], save_strategy="no", use_cpu=True, ddp_backend="gloo",
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens())
    trainer.train()
    del trainer  # as PyTorch asks: the model freed, then the group (left to exit, gloo aborted rank 1 now and then)
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
