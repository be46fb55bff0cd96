"""Analytic recipe facts checked against the real torch models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.catalog.recipes import RECIPES, recipe_info

REPO = Path(__file__).resolve().parents[2]


def _params(model) -> int:
    # Tied weights counted once, as DeepSpeed's model_to_params does.
    return sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())


def _largest_layer(model) -> int:
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def _model(recipe: str, size: str | None = None, num_layers: int | None = None):
    from launcher.recipes import bert, convnet, gpt2, resnet

    if recipe == "convnet":
        return convnet.build_model()
    if recipe == "resnet50":
        return resnet.ResNet50()
    module = bert if recipe == "bert" else gpt2
    return module.build_model(size, num_layers)


@pytest.mark.parametrize("recipe, size, num_layers, expected", [
    ("convnet", None, None, 315_722),
    ("resnet50", None, None, 25_557_032),
    ("bert", "base", None, 109_514_298),
    ("bert", "large", None, 335_174_458),
    ("bert", "large", 2, 58_057_530),
    ("gpt2", "small", None, 124_439_808),
])
def test_params_equal_the_real_model(recipe, size, num_layers, expected):
    info = recipe_info(recipe, size, num_layers=num_layers)
    model = _model(recipe, size, num_layers)
    assert info.params == _params(model) == expected
    assert info.largest_layer_params == _largest_layer(model)


def test_torchvision_resnet50_when_available():
    from launcher.recipes import resnet

    if not resnet.torchvision_available():
        pytest.skip("torchvision does not import beside this torch; the local ResNet-50 is used")
    assert _params(resnet.build_model()) == recipe_info("resnet50").params


def test_local_resnet50_keeps_torchvision_names():
    from launcher.recipes.resnet import ResNet50

    names = set(ResNet50().state_dict())
    assert {"conv1.weight", "layer1.0.downsample.0.weight", "layer4.2.bn3.running_var", "fc.bias"} <= names


def test_cnn_flops():
    # ConvNet MACs: 30*30*32*27 + 13*13*64*288 + 2304*128 + 128*10; training = 3 x forward = 6 x MACs.
    assert recipe_info("convnet").flops_per_sample == 6 * (777_600 + 3_115_008 + 294_912 + 1_280)
    # ResNet-50 is about 4.09 GMACs a 224x224 image.
    assert abs(recipe_info("resnet50").flops_per_sample / 6 - 4.09e9) < 0.02e9
    assert recipe_info("resnet50").tokens_per_sample == 0


def test_transformer_flops_and_tokens():
    info = recipe_info("bert", "large", seq_len=128)
    hidden, layers, seq = 1024, 24, 128
    assert info.tokens_per_sample == seq
    assert info.flops_per_sample == 6 * info.params * seq + 12 * layers * hidden * seq * seq
    gpt2 = recipe_info("gpt2")
    assert (gpt2.size, gpt2.seq_len, gpt2.num_layers) == ("small", 1024, 12)
    assert recipe_info("bert").seq_len == 128 and recipe_info("bert").size == "base"


def test_activation_estimates_grow_with_sequence_and_depth():
    short = recipe_info("bert", "large", seq_len=128).activation_bytes_per_sample
    assert recipe_info("bert", "large", seq_len=512).activation_bytes_per_sample > 4 * short
    assert recipe_info("bert", "large", num_layers=2).activation_bytes_per_sample < short
    assert recipe_info("resnet50").activation_bytes_per_sample > recipe_info("convnet").activation_bytes_per_sample


@pytest.mark.parametrize("args, message", [
    (("vgg",), "unknown recipe"),
    (("bert", "huge"), "base, large"),
    (("gpt2", None, 2048), "exceeds"),
    (("bert", None, None, 0), "num_layers"),
])
def test_bad_requests_name_the_choices(args, message):
    with pytest.raises(ValueError, match=message):
        recipe_info(*args)


def test_recipes_listed():
    assert RECIPES == ("convnet", "resnet50", "bert", "gpt2")


def test_recipe_info_does_not_import_torch():
    code = "import sys; from launcher.catalog.recipes import recipe_info; recipe_info('bert'); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
