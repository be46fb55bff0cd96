"""Numbers a program logs itself (``launcher.metrics.logged``): Hugging Face Trainer's log lines, read as literals
only, bounded, and put on the rank's next observed record."""

from __future__ import annotations

from launcher.metrics.logged import read_logged, with_logged
from launcher.metrics.record import MetricRecord


def test_the_trainers_log_lines_old_and_new_are_read_and_others_are_not() -> None:
    new = "{'loss': '4.553', 'grad_norm': '0.8062', 'learning_rate': '3.75e-05', 'epoch': '0.03125'}"
    assert read_logged(new) == {"loss": 4.553, "learning_rate": 3.75e-05, "epoch": 0.03125}
    assert read_logged("{'loss': 2.5, 'learning_rate': 5e-05, 'epoch': 1.0}") == {"loss": 2.5, "learning_rate": 5e-05, "epoch": 1.0}
    for line in ("{'train_runtime': 3.2, 'train_loss': 4.5, 'epoch': 0.1}",  # the summary: no step's loss
                 "{'loss': float('nan'), 'epoch': 1}", "{'loss': 1e999, 'epoch': 1}", "{'loss': __import__('os'), 'epoch': 1}",
                 "{'loss': 1, 'epoch': 1" + " " * 3000 + "}", "step 3 loss 2.5", "{'loss': 'high', 'epoch': 'one'}"):
        assert read_logged(line) is None, line


def test_an_observed_record_gets_the_logged_loss_where_it_had_none_and_the_reporters_records_nothing() -> None:
    logged = {"loss": 4.5, "learning_rate": 3e-05, "epoch": 0.5}
    observed = with_logged(MetricRecord(rank=0, step=5, steps=5, observed=True), logged)
    assert observed.loss == 4.5 and observed.extra == {"learning_rate": 3e-05, "epoch": 0.5}
    honest = with_logged(MetricRecord(rank=0, step=5, steps=5, observed=True, loss=4.4), logged)
    assert honest.loss == 4.4, "the loss the hooks read stays"
    reported = MetricRecord(rank=0, step=5, steps=5, loss=None)
    assert with_logged(reported, logged) is reported
