"""Launch's step hooks: a rank's training step observed from inside, with no change to the program.

Installed by the start-up hook (``sitehook``) once the rank has imported torch; written on the node as
``launch_stephooks.py``. What it observes, and how:

- **Steps and step time**: ``torch.optim.optimizer.register_optimizer_step_post_hook`` fires after the step of every
  ``torch.optim.Optimizer`` (DeepSpeed's inner optimizer, HF Trainer's and Accelerate's included). One training step
  is one step of the *lead* optimizer: the first whose step fired. Other optimizers stepping in the same iteration
  (a GAN's second one, a wrapper stepping the optimizer it wraps) are not counted again; an optimizer that steps twice
  while the lead does not becomes the lead (the program replaced its optimizer). Gradient accumulation calls no step
  until the last micro-batch, and a skipped fp16/AMP step (GradScaler or DeepSpeed finding an overflow) does not call
  the optimizer's step: neither is counted as a step.
- **Samples and tokens**: the batches ``torch.utils.data.DataLoader`` yields between two steps: the first dimension of
  the batch's first tensor (of ``input_ids`` in a dict), and the size of its first integer tensor of two or more
  dimensions as tokens. A step with no DataLoader batch counts ``LAUNCH_GLOBAL_BATCH / WORLD_SIZE`` samples when the
  spec gave ``batch:``; else samples are not measured (records carry ``samples_per_sec: null``: steps/s only).
- **Loss**: from the scalars given to ``Tensor.backward()`` on a reporting step, read from their autograd graph
  before the backward runs: each must come from a loss function or a mean (its grad_fn says so), either as it is
  or divided by a constant whole number N equal to the step's count of backward calls (gradient accumulation:
  a program's ``loss / accum``, DeepSpeed's engine and Accelerate dividing by their accumulation steps), and at
  most multiplied by a constant 1 (DeepSpeed's loss scale in fp32 and bf16). The step's loss is then the mean of
  its micro-batches' losses (the sum of the divided scalars). Anything else is left out, never guessed: a loss
  divided by a token count or by other than the step's backward calls, multiplied by a loss scale other than 1
  (GradScaler, fp16) or by the world size, or a step with more than ``MAX_BACKWARDS`` backward calls.
- **Memory**: CUDA's max allocated (reset each reporting interval) when the rank uses CUDA, else peak RSS.

Records are the Reporter's (``@@launch`` lines, version 1, the same keys and the same ``every``), with
``observed: true``; one written while a tqdm bar is drawn starts on a new line (``bar_drawn``).
When Python begins to shut down (the program's main returned or it called ``sys.exit``: the first
thing ``threading._shutdown`` does, before it joins the program's threads and before ``atexit`` and the destructors),
the rank writes its last partial interval with ``ended: true`` (a record of no steps when the interval is empty): a
rank that then never exits is known to be stuck in exit, not in training. When the program makes launch's own
``Reporter``, its records win: the hooks stop writing.
Standard library only (torch is the program's): it runs where launch need not be installed.
"""

import atexit
import json
import math
import os
import resource
import socket
import sys
import threading
import time
import weakref

MARKER = "@@launch "
MAX_MAGNITUDE = 1e30
LOSS_NODES = ("Loss", "CrossEntropy", "MeanBackward")  # grad_fn names of a loss as a loss function made it
DEFAULT_EVERY = 10
MAX_BACKWARDS = 1024  # the scalars of a reporting step kept for its loss (more: no loss for that step)


def _int_env(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


class StepHooks:
    """One rank's observed steps: counted by the hooks, written as a record every ``every`` steps."""

    def __init__(self, torch, stream=None):
        self.torch = torch
        self.every = max(1, _int_env("LAUNCH_METRICS_EVERY", _int_env("LAUNCH_AUTO_METRICS", DEFAULT_EVERY)))
        world = max(1, _int_env("WORLD_SIZE", 1))
        global_batch = _int_env("LAUNCH_GLOBAL_BATCH", 0)
        self.spec_samples = global_batch // world if global_batch >= world else 0
        self.stream = stream
        self.ident = {"job": os.environ.get("LAUNCH_JOB_ID", ""), "node": _int_env("LAUNCH_NODE", 0),
                      "rank": _int_env("RANK", 0), "local_rank": _int_env("LOCAL_RANK", 0), "host": socket.gethostname()}
        self.step = 0
        self.lead = None
        self.others = set()
        self.steps = self.samples = self.tokens = self.batches = 0
        self.spec_steps = 0  # steps of the interval whose samples came from the spec's batch
        self.backwards = 0
        self.losses = []  # (scalar, N) of each backward of a reporting step: N from ``loss_divisor``
        self.started = None
        self.stopped = False
        self.uninstall = None  # set by ``install``

    # -- the hooks (every step: a few attribute updates) --

    def on_batch(self, batch):
        if self.started is None:
            self.started = time.perf_counter()
        samples, tokens = batch_size(batch, self.torch)
        self.batches += 1
        self.samples += samples
        self.tokens += tokens

    def on_backward(self, tensor):
        if self.started is None:
            self.started = time.perf_counter()
        self.backwards += 1
        if (self.step + 1) % self.every == 0 and len(self.losses) < MAX_BACKWARDS:
            self.losses.append((tensor, loss_divisor(tensor)))  # before the backward frees what the graph saved

    def on_step(self, optimizer, args, kwargs):
        if self.stopped:
            return
        if not self._leads(optimizer):
            return
        if self.started is None:
            self.started = time.perf_counter()
        self.step += 1
        self.steps += 1
        if not self.batches and self.spec_samples:
            self.samples += self.spec_samples
            self.spec_steps += 1
        self.batches = 0
        losses, self.losses = self.losses, []
        backwards, self.backwards = self.backwards, 0
        if self.step % self.every == 0:
            self.emit(step_loss(losses, backwards))

    def _leads(self, optimizer):
        """Whether this optimizer's step is the iteration's step (see the module docstring)."""
        lead = self.lead() if self.lead is not None else None
        if lead is None or lead is optimizer:
            if lead is None:
                self.lead = weakref.ref(optimizer)
            self.others.clear()
            return True
        key = id(optimizer)
        if key in self.others:  # stepped twice while the lead did not: the program's optimizer now
            self.lead = weakref.ref(optimizer)
            self.others.clear()
            return True
        self.others.add(key)
        return False

    # -- the record --

    def emit(self, loss=None, ended=False):
        """Write the interval's record (unless launch's Reporter writes this rank's), then start a new interval;
        ``ended``: the program's last (Python is shutting down)."""
        if reporter_active():
            self.stopped = True
            return
        torch = self.torch
        cuda = torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        elapsed = max(now - (self.started or now), 1e-9)
        measured = self.steps > 0 and self.samples > 0 and (self.spec_steps == 0 or self.spec_steps == self.steps)
        record = {
            "v": 1, **self.ident, "step": self.step, "t": time.time(), "warmup": self.step <= self.every,
            "steps": self.steps, "interval_s": elapsed if self.steps else 0.0,
            "step_time_s": elapsed / self.steps if self.steps else None,
            "samples": self.samples if measured else 0, "tokens": self.tokens if measured else 0,
            "samples_per_sec": self.samples / elapsed if measured else None,
            "tokens_per_sec": self.tokens / elapsed if measured and self.tokens else None,
            "loss": loss, "mem_peak_bytes": peak_memory(torch, cuda),
            "gpu_name": torch.cuda.get_device_name()[:200] if cuda else None, "observed": True,
        }
        if ended:
            record["ended"] = True
        stream = self.stream or sys.stdout or sys.__stdout__
        if stream is None:  # no stdout at all (pythonw, closed by the program): nothing to say
            self.stopped = True
            return
        line = MARKER + json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        try:
            stream.write("\n" + line if bar_drawn() else line)
            stream.flush()
        except (OSError, ValueError):  # stdout closed by the program: nothing more to say
            self.stopped = True
        self.steps = self.samples = self.tokens = self.spec_steps = 0
        self.started = time.perf_counter()

    def close(self):
        """At shutdown (once): the last partial interval, marked ``ended``."""
        if not self.stopped:
            self.emit(ended=True)
            self.stopped = True


def reporter_active():
    """Whether the program made launch's own Reporter (its records win)."""
    module = sys.modules.get("launcher.metrics.reporter")
    return bool(getattr(module, "ACTIVE", False))


def batch_size(batch, torch, depth=0):
    """(samples, tokens) of one batch: the first tensor's first dimension, the first integer matrix's size."""
    tensor_type = torch.Tensor
    tensors = _tensors(batch, tensor_type, depth)
    samples = tokens = 0
    for tensor in tensors:
        if tensor.dim() == 0:
            continue
        if not samples:
            samples = int(tensor.shape[0])
        if tensor.dim() >= 2 and not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool:
            tokens = int(tensor.numel())
            break
    return samples, tokens


def _tensors(batch, tensor_type, depth):
    if isinstance(batch, tensor_type):
        return [batch]
    if depth > 2:
        return []
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        keys = list(batch.keys())
        if "input_ids" in keys:
            keys.remove("input_ids")
            keys.insert(0, "input_ids")
        values = [batch[key] for key in keys[:16]]
    elif isinstance(batch, (list, tuple)):
        values = list(batch[:16])
    else:
        return []
    out = []
    for value in values:
        out.extend(_tensors(value, tensor_type, depth + 1))
    return out


def loss_divisor(tensor):
    """N when ``tensor`` is provably a loss function's value (or a mean) divided by the constant whole number N
    (1: not divided), at most then multiplied by a constant 1; else None. Read before the backward runs."""
    if tensor.numel() != 1 or not tensor.is_floating_point():
        return None
    node, divisor, scaled, divided = getattr(tensor, "grad_fn", None), 1, False, False
    while node is not None:
        name = type(node).__name__
        if any(part in name for part in LOSS_NODES):
            return divisor
        operand = _constant_operand(node)
        if name in ("MulBackward0", "MulBackward1") and operand == 1.0 and not scaled and not divided:
            scaled = True  # DeepSpeed's loss scale where it scales nothing (fp32, bf16)
        elif name in ("DivBackward0", "DivBackward1") and operand is not None and operand >= 1 and operand.is_integer() \
                and not divided:
            divisor, divided = int(operand), True  # Lightning divides by its accumulation even when it is 1
        else:
            return None
        node = node.next_functions[0][0]
    return None


def _constant_operand(node):
    """The constant second operand of a binary autograd node (a number, or a one-element tensor on the CPU: no
    device sync), as a float; None when it has a gradient or is anything else."""
    inputs = node.next_functions
    if len(inputs) != 2 or inputs[1][0] is not None:
        return None
    try:
        other = node._saved_other
    except (AttributeError, RuntimeError):  # not saved, or freed by an earlier backward
        return None
    if isinstance(other, (int, float)):
        return float(other)
    if getattr(other, "device", None) is None or other.device.type != "cpu" or other.numel() != 1:
        return None
    return float(other.item())


def step_loss(losses, backwards):
    """A step's loss from its backward scalars (see the module docstring): each a loss divided by the step's count
    of backward calls, so their sum is the mean of its micro-batches' losses; else None."""
    if not backwards or len(losses) != backwards or any(divisor != backwards for _, divisor in losses):
        return None
    value = sum(float(tensor.detach().float().item()) for tensor, _ in losses)
    return value if math.isfinite(value) and abs(value) <= MAX_MAGNITUDE else None


def bar_drawn():
    """Whether a live tqdm bar draws on the rank's stdout or stderr (one stream: ``sitehook``). tqdm leaves the
    cursor at the end of its bar, mid-line: a record written then would trail the bar's text and be read as
    output, so it starts on a line of its own (an empty line where the program had ended the bar's line itself)."""
    std = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(std, "tqdm", None), "_instances", ())):
        try:
            if not bar.disable and bar.fp.fileno() in (1, 2):
                return True
        except (AttributeError, OSError, ValueError):  # a bar on no file descriptor (a notebook's, a StringIO)
            continue
    return False


def peak_memory(torch, cuda):
    """CUDA's max allocated since the last record (then reset), or this process's peak RSS."""
    if cuda:
        peak = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        return peak
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def at_shutdown(func):
    """Call ``func`` when Python begins to shut down: first in ``threading._shutdown`` (before the program's own
    threads are joined), else (an interpreter without it) at ``atexit``, which runs after them."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(func)
            return
        except RuntimeError:  # shutdown has begun already
            return
    atexit.register(func)


def install(stream=None):
    """Install the hooks in this process (torch imported); the ``StepHooks`` counting its steps (``uninstall``
    restores what they replaced: benchmarks turn them on and off in one process)."""
    torch = sys.modules["torch"]
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    hooks = StepHooks(torch, stream)
    handle = register_optimizer_step_post_hook(hooks.on_step)
    next_batch = _BaseDataLoaderIter.__next__
    backward = torch.Tensor.backward

    def __next__(self):
        batch = next_batch(self)
        hooks.on_batch(batch)
        return batch

    def observed_backward(self, *args, **kwargs):
        hooks.on_backward(self)
        return backward(self, *args, **kwargs)

    observed_backward.__doc__ = backward.__doc__
    setattr(_BaseDataLoaderIter, "__next__", __next__)  # noqa: B010 - a method replaced: mypy refuses the assignment
    setattr(torch.Tensor, "backward", observed_backward)  # noqa: B010
    at_shutdown(hooks.close)

    def uninstall():
        handle.remove()
        setattr(_BaseDataLoaderIter, "__next__", next_batch)  # noqa: B010
        setattr(torch.Tensor, "backward", backward)  # noqa: B010
        hooks.stopped = True
        atexit.unregister(hooks.close)

    hooks.uninstall = uninstall
    return hooks
