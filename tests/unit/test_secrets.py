"""Secrets come from the submitter's environment, and only values long enough to mask safely."""

from __future__ import annotations

import pytest

from launcher.errors import SpecError
from launcher.run.secrets import read_secrets


def test_a_secret_of_one_character_is_refused_since_masking_it_would_reveal_it():
    with pytest.raises(SpecError) as caught:
        read_secrets(["WANDB_API_KEY", "PIN"], {"WANDB_API_KEY": "0123456789abcdef", "PIN": "7"})
    assert "PIN is shorter than 8 characters" in str(caught.value)
    assert "WANDB_API_KEY" not in str(caught.value)


def test_secrets_long_enough_are_given_as_they_are():
    assert read_secrets(["TOKEN"], {"TOKEN": "s3cr3t-token"}) == {"TOKEN": "s3cr3t-token"}


def test_missing_secrets_are_named_together():
    with pytest.raises(SpecError, match="A, B not set in your environment"):
        read_secrets(["A", "B"], {})
