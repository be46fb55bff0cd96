"""The built-in recipes as they run inside every rank (torch, DeepSpeed, transformers).
Their facts for planning (sizes, FLOPs) live in launcher.catalog.recipes."""
