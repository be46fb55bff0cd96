#!/usr/bin/env python
"""What launch's step hooks (``launcher.node.stephooks``) cost a rank and a Python process (issue 35).

1. Steady step time, hooks on vs off, interleaved in one process: the hooks are installed and removed
   (``uninstall``) round by round, in alternating order, on the ConvNet recipe's model (CIFAR-sized batches from
   a DataLoader) and on a tiny GPT-ish loop (a short step: the hard case). The figure: the median of the rounds'
   ratios on/off (target <= 1.01x). The hooks' own cost per step is timed too (their three calls, in process).
2. Start-up cost added to a rank: importing the hooks' module and installing them once torch is imported
   (target <= 20 ms), timed in process.
3. Start-up cost added to a Python process that never imports torch: ``python -c pass`` with the hooks' folder
   first on PYTHONPATH vs without, alternating, median of the paired differences (target <= 2 ms); and
   ``-X importtime``'s own figure for ``sitecustomize``.

    python scripts/bench_hooks.py [--rounds 15] [--steps 30] [--starts 40] [--no-gpt]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _hooks_dir() -> str:
    from launcher.node.agent import write_step_hooks
    from launcher.node.ship import step_hook_files

    return write_step_hooks(tempfile.mkdtemp(prefix="bench-hooks-"), step_hook_files(), None)


def _import_hooks(folder: str):
    sys.path.insert(0, folder)
    try:
        import launch_stephooks
    finally:
        sys.path.remove(folder)
    return launch_stephooks


def convnet_workload(steps: int):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from launcher.recipes.convnet import build_model

    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(32 * steps, 3, 32, 32), torch.randint(0, 10, (32 * steps,)))

    def run() -> float:
        start = time.perf_counter()
        for images, labels in DataLoader(data, batch_size=32):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - start) / steps

    return run


def gpt_workload(steps: int):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    vocab, block = 64, 16
    model = nn.Sequential(nn.Embedding(vocab, 32), nn.TransformerEncoderLayer(32, 2, 64, batch_first=True),
                          nn.Linear(32, vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            data = torch.randint(0, vocab, (4, block + 1))
            logits = model(data[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - start) / steps

    return run


def step_ratio(name: str, run, module, rounds: int) -> None:
    """Rounds of (on, off) in alternating order; the median of the rounds' ratios."""
    run()  # warm up (allocator, kernels)
    ratios, on_times, off_times = [], [], []
    for index in range(rounds):
        times = {}
        for mode in (("on", "off") if index % 2 == 0 else ("off", "on")):
            hooks = module.install(stream=io.StringIO()) if mode == "on" else None
            times[mode] = run()
            if hooks is not None:
                hooks.uninstall()
        ratios.append(times["on"] / times["off"])
        on_times.append(times["on"])
        off_times.append(times["off"])
    print(f"{name}: step {statistics.median(off_times) * 1e3:.2f} ms off, {statistics.median(on_times) * 1e3:.2f} ms on; "
          f"ratio on/off median {statistics.median(ratios):.4f}x over {rounds} rounds "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


def own_cost(module) -> None:
    """The hooks' three calls a step (a batch, a backward, an optimizer step), timed in process."""
    import torch

    hooks = module.StepHooks(torch, io.StringIO())
    hooks.every = 10**9
    batch = (torch.zeros(32, 3, 4, 4), torch.zeros(32, dtype=torch.long))
    loss = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    count = 100_000
    start = time.perf_counter()
    for _ in range(count):
        hooks.on_batch(batch)
        hooks.on_backward(loss)
        hooks.on_step(optimizer, (), {})
    print(f"hooks' own cost: {(time.perf_counter() - start) / count * 1e6:.2f} us a step (batch + backward + step)")


def rank_startup(folder: str) -> None:
    """Importing the hooks' module and installing them, in a fresh process that has imported torch."""
    code = (f"import sys, time; import torch; t = time.perf_counter(); sys.path.insert(0, {folder!r}); "
            "import launch_stephooks; launch_stephooks.install(); print((time.perf_counter() - t) * 1e3)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    samples = [float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout.split()[0]) for _ in range(5)]  # (then the hooks' end record)
    print(f"start-up added to a rank (hooks imported and installed after torch): median {statistics.median(samples):.2f} ms "
          f"(max {max(samples):.2f}) over {len(samples)} processes")


def plain_startup(folder: str, starts: int) -> None:
    """``python -c pass`` with and without the hooks' folder on PYTHONPATH, alternating."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOCAL_RANK")}
    hooked = {**base, "PYTHONPATH": folder, "LOCAL_RANK": "0"}

    def once(env) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        return time.perf_counter() - start

    once(base), once(hooked)
    diffs, with_hooks, without = [], [], []
    for index in range(starts):
        pair = {}
        for name in (("with", "without") if index % 2 == 0 else ("without", "with")):
            pair[name] = once(hooked if name == "with" else base)
        diffs.append(pair["with"] - pair["without"])
        with_hooks.append(pair["with"])
        without.append(pair["without"])
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=hooked, capture_output=True, text=True)
    # (in a rank, LOCAL_RANK set, the start-up hook sends stderr where stdout goes: -X importtime's lines with it)
    own = re.search(r"import time:\s+(\d+) \|\s+(\d+) \|\s*sitecustomize", done.stdout + done.stderr)
    print(f"start-up added to a Python process without torch: median paired difference {statistics.median(diffs) * 1e3:.2f} ms "
          f"({statistics.median(without) * 1e3:.1f} ms -> {statistics.median(with_hooks) * 1e3:.1f} ms, {starts} pairs); "
          f"-X importtime sitecustomize: {int(own[2]) / 1e3 if own else float('nan'):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--no-gpt", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    folder = _hooks_dir()
    module = _import_hooks(folder)
    plain_startup(folder, args.starts)
    rank_startup(folder)
    own_cost(module)
    step_ratio("convnet", convnet_workload(args.steps), module, args.rounds)
    if not args.no_gpt:
        step_ratio("tiny gpt", gpt_workload(args.steps * 4), module, args.rounds)


if __name__ == "__main__":
    main()
