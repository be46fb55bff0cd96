"""Training data for the recipes: deterministic synthetic batches, or real files.

Every source yields, per optimizer step, this rank's whole step batch
(``micro_batch * grad_accum`` samples) as a dict of CPU tensors; the loop
splits it into micro-batches. The data position is counted in global samples:
step s consumes the global batch's samples s*G .. (s+1)*G - 1, rank r the
slice r*n .. (r+1)*n - 1 of them (n = micro x accumulation), built in
micro-batch chunks each seeded by its global position. So a step's samples
are the same at any world size with the same global and micro batch: a job
resumed on fewer nodes (issue 22) sees exactly the data an uninterrupted one would.

Real data (``--data-path``): CIFAR-10 python batches (``data_batch_*``) for
convnet, an ImageFolder tree for resnet50 (needs torchvision), a ``.npy``
array or raw uint16 file of token ids for bert/gpt2. Each rank reads a
disjoint shard of a per-epoch permutation, like DistributedSampler.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from launcher.catalog.recipes import (
    BERT_VOCAB,
    CIFAR_CLASSES,
    CIFAR_IMAGE,
    GPT2_VOCAB,
    IMAGENET_CLASSES,
    IMAGENET_IMAGE,
)

BERT_MASK_ID = 103
BERT_FIRST_WORD_ID = 1000  # ids below are [PAD], [unusedN], [UNK], [CLS], [SEP], [MASK]
MLM_PROBABILITY = 0.15
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PATTERN_GRID = 8  # synthetic class patterns are 8x8 per channel, upsampled


class DataError(ValueError):
    """Training data that cannot be used (the message names the file and the problem)."""


@dataclass(frozen=True)
class DataSpec:
    """Where this rank's batches come from and how big they are."""

    recipe: str
    rank: int
    world_size: int
    seed: int
    samples_per_step: int
    seq_len: int = 0
    data_path: str | None = None
    micro_batch: int | None = None  # the chunk every sample position is seeded by (default: the whole step)

    @property
    def chunk(self) -> int:
        return self.micro_batch or self.samples_per_step

    @property
    def global_batch(self) -> int:
        return self.samples_per_step * self.world_size

    def chunk_starts(self, step: int) -> range:
        """The global sample positions of this rank's micro-batch chunks in ``step``."""
        first = step * self.global_batch + self.rank * self.samples_per_step
        return range(first, first + self.samples_per_step, self.chunk)


def step_batches(spec: DataSpec, start_step: int, max_steps: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's step batches for steps ``start_step`` .. ``max_steps - 1``."""
    if spec.data_path is None:
        make = _SYNTHETIC[spec.recipe]
        for step in range(start_step, max_steps):
            yield _joined([make(spec, _generator(spec.seed, start), spec.chunk) for start in spec.chunk_starts(step)])
        return
    if spec.recipe == "resnet50":
        yield from _image_folder_batches(spec, start_step, max_steps)
        return
    path = Path(spec.data_path)
    source = _cifar_source(spec, path) if spec.recipe == "convnet" else _token_source(spec, path)
    indexer = _StepIndexer(len(source), spec)
    for step in range(start_step, max_steps):
        indices = indexer.indices(step)
        yield _joined([source.batch(indices[i * spec.chunk : (i + 1) * spec.chunk], _generator(spec.seed, start))
                       for i, start in enumerate(spec.chunk_starts(step))])


def prefetched(batches: Iterator[dict[str, torch.Tensor]], depth: int = 2,
               pin: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """The same batches in the same order, made ``depth`` ahead in a background thread while the device
    computes (torch's ops release the GIL), and pinned when ``pin`` so the copy to the GPU is asynchronous.

    A source error is raised here, at the batch it would have been; closing this iterator stops the thread.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer({key: value.pin_memory() for key, value in batch.items()} if pin else batch):
                    return
            offer(done)
        except BaseException as exc:  # handed to the training loop, which raises it as the source would have
            offer(exc)

    thread = threading.Thread(target=produce, name="launch-data", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def split_micro_batches(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """Split a step batch into ``count`` equal micro-batches along the first dimension."""
    pieces = {key: value.chunk(count) for key, value in batch.items()}
    return [{key: pieces[key][i] for key in batch} for i in range(count)]


def _joined(chunks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return chunks[0] if len(chunks) == 1 else {key: torch.cat([c[key] for c in chunks]) for key in chunks[0]}


def _generator(seed: int, position: int) -> torch.Generator:
    """The generator of the chunk that starts at global sample ``position``."""
    mixed = (seed * 0x9E3779B1 + (position + 1) * 0xC2B2AE3D) % (2**63)
    return torch.Generator().manual_seed(mixed)


def _class_patterns(seed: int, classes: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(classes, 3, PATTERN_GRID, PATTERN_GRID, generator=gen)


def _synthetic_images(spec: DataSpec, gen: torch.Generator, n: int, shape: tuple[int, int, int], classes: int):
    labels = torch.randint(0, classes, (n,), generator=gen)
    _, height, width = shape
    patterns = _class_patterns(spec.seed, classes)[labels]
    patterns = patterns.repeat_interleave(height // PATTERN_GRID, 2).repeat_interleave(width // PATTERN_GRID, 3)
    noise = torch.randn(n, *shape, generator=gen)
    return {"images": noise + patterns, "labels": labels}


def _synthetic_convnet(spec: DataSpec, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    return _synthetic_images(spec, gen, n, CIFAR_IMAGE, CIFAR_CLASSES)


def _synthetic_resnet(spec: DataSpec, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    return _synthetic_images(spec, gen, n, IMAGENET_IMAGE, IMAGENET_CLASSES)


def _progressions(spec: DataSpec, gen: torch.Generator, n: int, low: int, high: int) -> torch.Tensor:
    """Token rows that count up from a random start with a random stride: learnable."""
    start = torch.randint(0, high - low, (n, 1), generator=gen)
    stride = torch.randint(1, 5, (n, 1), generator=gen)
    return low + (start + stride * torch.arange(spec.seq_len)) % (high - low)


def _synthetic_bert(spec: DataSpec, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    return mlm_inputs(_progressions(spec, gen, n, BERT_FIRST_WORD_ID, BERT_VOCAB), gen)


def _synthetic_gpt2(spec: DataSpec, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    return causal_lm_inputs(_progressions(spec, gen, n, 0, GPT2_VOCAB))


_SYNTHETIC = {
    "convnet": _synthetic_convnet,
    "resnet50": _synthetic_resnet,
    "bert": _synthetic_bert,
    "gpt2": _synthetic_gpt2,
}


def mlm_inputs(tokens: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """BERT masking: 15% of positions (at least one a row) become targets;
    of those 80% turn into [MASK], 10% a random word, 10% stay."""
    tokens = tokens.long()
    chosen = torch.rand(tokens.shape, generator=gen) < MLM_PROBABILITY
    forced = torch.randint(0, tokens.shape[1], (tokens.shape[0],), generator=gen)
    chosen[torch.arange(tokens.shape[0]), forced] |= ~chosen.any(dim=1)
    labels = torch.where(chosen, tokens, torch.full_like(tokens, -100))
    roll = torch.rand(tokens.shape, generator=gen)
    random_words = torch.randint(BERT_FIRST_WORD_ID, BERT_VOCAB, tokens.shape, generator=gen)
    inputs = torch.where(chosen & (roll < 0.8), torch.full_like(tokens, BERT_MASK_ID), tokens)
    inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_words, inputs)
    return {"input_ids": inputs, "attention_mask": torch.ones_like(inputs), "labels": labels}


def causal_lm_inputs(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Next-token prediction: labels are the inputs (the model shifts them)."""
    tokens = tokens.long()
    return {"input_ids": tokens, "labels": tokens.clone()}


class _StepIndexer:
    """Per-step sample indices of one rank: its slice of the step's global batch, read in the order of a
    per-epoch permutation (so the same at any world size with the same global batch)."""

    def __init__(self, size: int, spec: DataSpec) -> None:
        self._size = size
        self._spec = spec
        self._steps_per_epoch = size // spec.global_batch
        if self._steps_per_epoch == 0:
            raise DataError(
                f"{spec.data_path}: {size} samples cannot fill one step of "
                f"{spec.samples_per_step} samples on each of {spec.world_size} ranks"
            )
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> torch.Tensor:
        epoch, offset = divmod(step, self._steps_per_epoch)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self._spec.seed * 1_000_003 + epoch)
            self._order = torch.randperm(self._size, generator=gen)
            self._epoch = epoch
        first = offset * self._spec.global_batch + self._spec.rank * self._spec.samples_per_step
        return self._order[first : first + self._spec.samples_per_step]


class _ArraySource:
    """Samples held in (memory-mapped) arrays, gathered by index."""

    def __init__(self, build, size: int) -> None:
        self._build = build
        self._size = size

    def __len__(self) -> int:
        return self._size

    def batch(self, indices: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return self._build(np.sort(indices.numpy()), gen)


def _cifar_source(spec: DataSpec, root: Path) -> _ArraySource:
    files = sorted(root.glob("data_batch_*"))
    if not files:
        raise DataError(f"{root}: no CIFAR-10 python batches (data_batch_1 ...) found")
    images, labels = [], []
    for file in files:
        with open(file, "rb") as handle:
            entry = pickle.load(handle, encoding="bytes")
        images.append(np.asarray(entry[b"data"], dtype=np.uint8).reshape(-1, *CIFAR_IMAGE))
        labels.extend(entry[b"labels"])
    pixels = torch.from_numpy(np.concatenate(images))
    targets = torch.tensor(labels, dtype=torch.long)
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)

    def build(idx: np.ndarray, gen: torch.Generator) -> dict[str, torch.Tensor]:
        rows = torch.from_numpy(idx)
        return {"images": (pixels[rows].float() / 255 - mean) / std, "labels": targets[rows]}

    return _ArraySource(build, len(targets))


def _token_source(spec: DataSpec, path: Path) -> _ArraySource:
    if not path.is_file():
        raise DataError(f"{path}: no such token file (.npy array or raw uint16 ids)")
    tokens = np.load(path, mmap_mode="r") if path.suffix == ".npy" else np.memmap(path, dtype=np.uint16, mode="r")
    vocab = BERT_VOCAB if spec.recipe == "bert" else GPT2_VOCAB
    if tokens.ndim == 2:
        if tokens.shape[1] < spec.seq_len:
            raise DataError(f"{path}: rows of {tokens.shape[1]} tokens are shorter than seq_len {spec.seq_len}")
        rows, size = tokens[:, : spec.seq_len], tokens.shape[0]
    elif tokens.ndim == 1:
        size = tokens.shape[0] // spec.seq_len
        rows = tokens[: size * spec.seq_len].reshape(size, spec.seq_len)
    else:
        raise DataError(f"{path}: expected a 1-D or 2-D array of token ids, got shape {tokens.shape}")

    def build(idx: np.ndarray, gen: torch.Generator) -> dict[str, torch.Tensor]:
        batch = torch.from_numpy(np.asarray(rows[idx], dtype=np.int64))
        if int(batch.max()) >= vocab or int(batch.min()) < 0:
            raise DataError(f"{path}: token ids outside 0..{vocab - 1} for {spec.recipe}")
        return mlm_inputs(batch, gen) if spec.recipe == "bert" else causal_lm_inputs(batch)

    return _ArraySource(build, size)


def _image_folder_batches(spec: DataSpec, start_step: int, max_steps: int) -> Iterator[dict[str, torch.Tensor]]:
    from launcher.recipes.resnet import torchvision_available

    if not torchvision_available():
        raise DataError(f"{spec.data_path}: reading an image folder needs torchvision, which does not import here")
    from torchvision import datasets, transforms

    dataset = datasets.ImageFolder(
        spec.data_path,
        transforms.Compose([
            transforms.RandomResizedCrop(IMAGENET_IMAGE[1]),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]),
    )
    indexer = _StepIndexer(len(dataset), spec)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=[indexer.indices(step).tolist() for step in range(start_step, max_steps)],
        num_workers=min(8, os.cpu_count() or 1),
        pin_memory=torch.cuda.is_available(),
        persistent_workers=False,
    )
    for images, labels in loader:
        yield {"images": images, "labels": labels}
