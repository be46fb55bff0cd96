"""Built-in training recipes and their analytic facts, without importing torch.

The planner and the memory estimator need each recipe's parameter count,
FLOPs per sample and an activation estimate before anything is launched, so
these are computed here from the architectures' shapes (pure arithmetic).
``tests/unit/test_recipe_info.py`` checks the counts against the real models.

The models themselves live in the sibling modules (``convnet``, ``resnet``,
``bert``, ``gpt2``), which import torch; the rank entry point is ``train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

RecipeName = Literal["convnet", "resnet50", "bert", "gpt2"]
RECIPES: tuple[str, ...] = get_args(RecipeName)
# The transformers recipes: AdamW with weight decay, built partitioned under ZeRO-3 (HfDeepSpeedConfig).
LANGUAGE_MODELS: tuple[str, ...] = ("bert", "gpt2")

# Transformer shapes: (hidden, layers, heads, intermediate).
BERT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
}
GPT2_SIZES: dict[str, tuple[int, int, int, int]] = {
    "small": (768, 12, 12, 3072),
    "medium": (1024, 24, 16, 4096),
    "large": (1280, 36, 20, 5120),
    "xl": (1600, 48, 25, 6400),
}
DEFAULT_SIZE = {"bert": "base", "gpt2": "small"}
DEFAULT_SEQ_LEN = {"bert": 128, "gpt2": 1024}

BERT_VOCAB, BERT_MAX_POSITIONS, BERT_TYPE_VOCAB = 30522, 512, 2
GPT2_VOCAB, GPT2_MAX_POSITIONS = 50257, 1024

CIFAR_IMAGE, CIFAR_CLASSES = (3, 32, 32), 10
IMAGENET_IMAGE, IMAGENET_CLASSES = (3, 224, 224), 1000

# ResNet-50 (torchvision v1.5 layout): blocks per stage and bottleneck widths.
RESNET50_BLOCKS = (3, 4, 6, 3)
RESNET50_WIDTHS = (64, 128, 256, 512)
RESNET_EXPANSION = 4

ACTIVATION_BYTES = 2  # activation estimates assume 16-bit activations (AMP)


@dataclass(frozen=True)
class RecipeInfo:
    """Analytic facts about one recipe configuration.

    ``params``: exact trainable parameter count (tied weights counted once).
    ``largest_layer_params``: the most parameters held directly by one module,
    as DeepSpeed's ZeRO-3 estimator counts them.
    ``flops_per_sample``: training FLOPs (forward + backward) for one sample.
    ``tokens_per_sample``: sequence length for language models, 0 for images.
    ``activation_bytes_per_sample``: activations kept for backward, one sample,
    16-bit activations (double it for fp32).
    """

    name: str
    params: int
    largest_layer_params: int
    flops_per_sample: float
    tokens_per_sample: int
    activation_bytes_per_sample: int
    size: str | None = None
    seq_len: int | None = None
    num_layers: int | None = None


def recipe_info(
    recipe: str,
    size: str | None = None,
    seq_len: int | None = None,
    num_layers: int | None = None,
) -> RecipeInfo:
    """Analytic facts for ``recipe`` at the given size, sequence length and depth.

    Raises ValueError naming the valid choices for an unknown recipe or size,
    a sequence longer than the model's positions, or a non-positive override.
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    if num_layers is not None and num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if seq_len is not None and seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if recipe == "convnet":
        return _convnet_info()
    if recipe == "resnet50":
        return _resnet50_info()
    return _transformer_info(recipe, size, seq_len, num_layers)


def model_problem(recipe: str | None, size: str | None, seq_len: int | None, num_layers: int | None) -> str | None:
    """Why a job's ``model:`` section cannot be built by ``recipe`` (naming the valid values), or None."""
    if recipe not in LANGUAGE_MODELS:
        return None
    sizes = BERT_SIZES if recipe == "bert" else GPT2_SIZES
    if size is not None and size not in sizes:
        return f"size {size!r} is not a {recipe} size; choose one of {', '.join(sizes)}"
    positions = BERT_MAX_POSITIONS if recipe == "bert" else GPT2_MAX_POSITIONS
    if seq_len is not None and seq_len > positions:
        return f"seq_len {seq_len} is more than {recipe}'s {positions} positions; choose 1 to {positions}"
    return None


def transformer_shape(recipe: str, size: str | None, num_layers: int | None) -> tuple[str, int, int, int, int]:
    """(size, hidden, layers, heads, intermediate) for a bert/gpt2 size, with a depth override."""
    sizes = BERT_SIZES if recipe == "bert" else GPT2_SIZES
    size = size or DEFAULT_SIZE[recipe]
    if size not in sizes:
        raise ValueError(f"unknown {recipe} size {size!r}; choose one of {', '.join(sizes)}")
    hidden, layers, heads, inner = sizes[size]
    return size, hidden, num_layers or layers, heads, inner


def _convnet_info() -> RecipeInfo:
    channels, height, width = CIFAR_IMAGE
    params = macs = acts = 0
    largest = 0
    for c_out in (32, 64):
        height, width = height - 2, width - 2  # 3x3 conv, no padding
        conv_params = channels * c_out * 9 + c_out
        params += conv_params
        largest = max(largest, conv_params)
        macs += height * width * c_out * channels * 9
        acts += 2 * height * width * c_out  # conv output + ReLU output
        height, width, channels = height // 2, width // 2, c_out
    features = channels * height * width  # 64 x 6 x 6 = 2304
    for f_in, f_out in ((features, 128), (128, CIFAR_CLASSES)):
        params += f_in * f_out + f_out
        largest = max(largest, f_in * f_out + f_out)
        macs += f_in * f_out
        acts += f_in + f_out
    return RecipeInfo(
        name="convnet",
        params=params,
        largest_layer_params=largest,
        flops_per_sample=3.0 * 2 * macs,
        tokens_per_sample=0,
        activation_bytes_per_sample=acts * ACTIVATION_BYTES,
    )


def _resnet50_info() -> RecipeInfo:
    counter = _ConvCounter(IMAGENET_IMAGE[1])
    counter.conv(IMAGENET_IMAGE[0], 64, kernel=7, stride=2)
    counter.bn(64)
    counter.spatial //= 2  # 3x3 max pool, stride 2
    in_ch = 64
    for stage, (blocks, width) in enumerate(zip(RESNET50_BLOCKS, RESNET50_WIDTHS)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            out_ch = width * RESNET_EXPANSION
            if block == 0:  # projection shortcut, computed on the block's input
                block_in = counter.spatial
                counter.conv(in_ch, out_ch, kernel=1, stride=stride)
                counter.bn(out_ch)
                counter.spatial = block_in
            counter.conv(in_ch, width, kernel=1)
            counter.bn(width)
            counter.conv(width, width, kernel=3, stride=stride)
            counter.bn(width)
            counter.conv(width, out_ch, kernel=1)
            counter.bn(out_ch)
            in_ch = out_ch
    fc = in_ch * IMAGENET_CLASSES + IMAGENET_CLASSES
    return RecipeInfo(
        name="resnet50",
        params=counter.params + fc,
        largest_layer_params=max(counter.largest, fc),
        flops_per_sample=3.0 * 2 * (counter.macs + in_ch * IMAGENET_CLASSES),
        tokens_per_sample=0,
        activation_bytes_per_sample=counter.activations * ACTIVATION_BYTES,
    )


class _ConvCounter:
    """Accumulates parameters, MACs and saved activations of a conv/BN stack."""

    def __init__(self, spatial: int) -> None:
        self.spatial = spatial
        self.params = self.macs = self.activations = self.largest = 0

    def conv(self, c_in: int, c_out: int, kernel: int, stride: int = 1) -> None:
        self.spatial = (self.spatial + 2 * (kernel // 2) - kernel) // stride + 1
        weights = c_in * c_out * kernel * kernel  # bias-free: BN follows
        self.params += weights
        self.largest = max(self.largest, weights)
        self.macs += self.spatial * self.spatial * weights
        self.activations += self.spatial * self.spatial * c_out

    def bn(self, channels: int) -> None:
        self.params += 2 * channels
        self.activations += 2 * self.spatial * self.spatial * channels  # BN + ReLU outputs


def _transformer_info(recipe: str, size: str | None, seq_len: int | None, num_layers: int | None) -> RecipeInfo:
    size, hidden, layers, heads, inner = transformer_shape(recipe, size, num_layers)
    seq_len = seq_len or DEFAULT_SEQ_LEN[recipe]
    if recipe == "bert":
        vocab, positions = BERT_VOCAB, BERT_MAX_POSITIONS
        embeddings = (vocab + positions + BERT_TYPE_VOCAB) * hidden + 2 * hidden
        # MLM head: transform dense + LayerNorm + decoder bias (decoder weight tied).
        head = hidden * hidden + hidden + 2 * hidden + vocab
        largest = vocab * hidden + vocab  # the decoder: tied weight + its bias
    else:
        vocab, positions = GPT2_VOCAB, GPT2_MAX_POSITIONS
        embeddings = (vocab + positions) * hidden
        head = 2 * hidden  # final LayerNorm; lm_head tied to the token embedding
        largest = vocab * hidden
    if seq_len > positions:
        raise ValueError(f"{recipe} seq_len {seq_len} exceeds its {positions} positions")
    per_layer = 4 * (hidden * hidden + hidden) + 2 * (hidden * inner) + inner + hidden + 4 * hidden
    params = embeddings + layers * per_layer + head
    # 6 N per token plus attention scores and their use: 12 * layers * hidden * seq per token.
    flops = 6.0 * params * seq_len + 12.0 * layers * hidden * seq_len * seq_len
    # Korthikanti et al. (2022): s*h*(34 + 5*a*s/h) bytes per layer at 16 bits,
    # plus the logits (16-bit) and their fp32 softmax for the loss.
    per_layer_act = seq_len * hidden * 34 + 5 * heads * seq_len * seq_len
    logits = seq_len * vocab * (2 + 4)
    return RecipeInfo(
        name=recipe,
        params=params,
        largest_layer_params=largest,
        flops_per_sample=flops,
        tokens_per_sample=seq_len,
        activation_bytes_per_sample=layers * per_layer_act + logits,
        size=size,
        seq_len=seq_len,
        num_layers=layers,
    )
