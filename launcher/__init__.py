"""launch: plan, start, watch and compare multi-node PyTorch training runs."""

__version__ = "0.1.0"
