"""Ranks grouped by stack into classes, as LLNL's STAT does: a prefix tree of frames, outermost first.

Every rank's ``py-spy dump`` text is parsed into its main thread's frames (py-spy prints the innermost
frame first; the tree is built from the outermost). Ranks that share a whole path end in the same
tree node: one class. A class is named by where its ranks are (the innermost frame) and by the frame
at which its path leaves the other ranks' (its branch in the tree), so 1,000 ranks read as

    ranks 0-511,513-1023: all_reduce <- train_step train.py:212
    rank 512: backward <- train_step train.py:208

Ranks without a stack (py-spy missing, a node that did not answer, no process found) form classes
of their own, by the reason. Pure functions on text: no I/O, no clock.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^ {4}(\S.*?) \((.*?)(?::(\d+))?\)\s*$")
# files of Python itself and of the libraries training programs run on (py-spy shortens paths to
# what follows sys.path, so torch's files read torch/distributed/...): never the program's own frame
LIBRARIES = frozenset({
    "torch", "deepspeed", "transformers", "accelerate", "lightning", "pytorch_lightning", "numpy", "triton",
    "apex", "megatron", "datasets", "tqdm", "torchvision", "torchaudio", "torchtext", "torchdata", "peft", "trl",
    "safetensors", "huggingface_hub", "wandb", "tensorboard", "fsspec", "ray", "launcher",
}) | frozenset(getattr(sys, "stdlib_module_names", ()))


@dataclass(frozen=True)
class Frame:
    """One frame as py-spy prints it: ``function (file:line)``."""

    function: str
    file: str
    line: int | None

    def where(self) -> str:
        """``train_step train.py:212`` (the file's last component)."""
        name = self.file.rsplit("/", 1)[-1]
        return f"{self.function} {name}:{self.line}" if self.line is not None else f"{self.function} {name}"

    def full(self) -> str:
        """``train_step lib/train.py:212`` (the file as py-spy gave it)."""
        return f"{self.function} {self.file}:{self.line}" if self.line is not None else f"{self.function} {self.file}"

    def as_json(self) -> list:
        return [self.function, self.file, self.line]


@dataclass(frozen=True)
class Thread:
    name: str
    state: str
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them


def parse_dump(text: str) -> list[Thread]:
    """The threads of one ``py-spy dump`` (locals and native-frame details are left out)."""
    threads: list[Thread] = []
    name = state = None
    frames: list[Frame] = []
    for raw in text.splitlines():
        if match := _THREAD.match(raw):
            if name is not None:
                threads.append(Thread(name, state or "", tuple(frames)))
            name, state, frames = match[3] or match[1], match[2], []
        elif name is not None and (frame := _FRAME.match(raw)):
            frames.append(Frame(frame[1], frame[2], int(frame[3]) if frame[3] else None))
    if name is not None:
        threads.append(Thread(name, state or "", tuple(frames)))
    return threads


def main_path(text: str) -> tuple[Frame, ...]:
    """The main thread's frames, outermost first (the first thread's when none is called MainThread)."""
    threads = parse_dump(text)
    if not threads:
        return ()
    main = next((t for t in threads if t.name == "MainThread"), threads[0])
    return tuple(reversed(main.frames))


def is_library(frame: Frame) -> bool:
    path = frame.file
    if "site-packages/" in path or "dist-packages/" in path or path.startswith("<"):
        return True
    top = path.lstrip("/").split("/", 1)[0]
    return top.removesuffix(".py") in LIBRARIES


@dataclass
class StackClass:
    """Ranks whose main threads have the same path (``frames``, outermost first), or no stack for the same
    ``reason``."""

    ranks: list[int]
    frames: tuple[Frame, ...] = ()
    reason: str | None = None
    branch: int = 0  # index in ``frames`` of the first frame this class does not share with every other rank
    label: str = ""

    @property
    def spans(self) -> str:
        return ranges(self.ranks)

    def as_json(self) -> dict:
        return {"ranks": self.spans, "count": len(self.ranks), "label": self.label, "rank_list": self.ranks,
                "frames": [f.as_json() for f in self.frames], "reason": self.reason}


@dataclass
class _Node:
    ranks: set[int] = field(default_factory=set)
    children: dict[Frame, _Node] = field(default_factory=dict)


def classify(paths: Mapping[int, tuple[Frame, ...]], missing: Mapping[int, str] | None = None) -> list[StackClass]:
    """Classes of ranks, the largest first (ties: the lowest rank first). ``paths``: each rank's frames,
    outermost first; ``missing``: ranks without a stack and why."""
    root = _Node()
    for rank, path in paths.items():
        node = root
        node.ranks.add(rank)
        for frame in path:
            node = node.children.setdefault(frame, _Node())
            node.ranks.add(rank)
    by_path: dict[tuple[Frame, ...], list[int]] = {}
    for rank, path in paths.items():
        by_path.setdefault(path, []).append(rank)
    classes = []
    for path, ranks in by_path.items():
        # the class leaves the others where the tree's node along its path stops holding other ranks,
        # apart from the ranks whose paths run on below this class's end
        end_ranks = _walk(root, path).ranks
        branch, node = len(path) - 1 if path else 0, root
        for index, frame in enumerate(path):
            node = node.children[frame]
            if node.ranks == end_ranks:
                branch = index
                break
        if len(by_path) == 1 or len(end_ranks) == len(paths):
            branch = -1  # every rank shares it: no branch, the program's frame names it
        classes.append(StackClass(sorted(ranks), path, branch=branch))
    reasons: dict[str, list[int]] = {}
    for rank, reason in (missing or {}).items():
        reasons.setdefault(reason, []).append(rank)
    classes += [StackClass(sorted(ranks), reason=reason) for reason, ranks in reasons.items()]
    classes.sort(key=lambda c: (-len(c.ranks), c.ranks[0]))
    _label(classes)
    return classes


def _walk(root: _Node, path: Sequence[Frame]) -> _Node:
    node = root
    for frame in path:
        node = node.children[frame]
    return node


def _label(classes: list[StackClass]) -> None:
    """``all_reduce <- train_step train.py:212``: where the ranks are, and the frame that tells their class
    apart (the program's innermost frame when every rank shares the path); more of the path where two
    labels would read alike."""
    for cls in classes:
        cls.label = _name(cls, detailed=False)
    seen: dict[str, int] = {}
    for cls in classes:
        seen[cls.label] = seen.get(cls.label, 0) + 1
    for cls in classes:
        if seen[cls.label] > 1:
            cls.label = _name(cls, detailed=True)


def _name(cls: StackClass, detailed: bool) -> str:
    if cls.reason is not None:
        return f"(no stack: {cls.reason})"
    if not cls.frames:
        return "(no Python frame in the main thread)"
    innermost = cls.frames[-1]
    anchor_at = cls.branch if cls.branch >= 0 else _program_frame(cls.frames)
    if is_library(cls.frames[anchor_at]):  # a branch inside a library reads by the program's call into it
        anchor_at = next((i for i in range(anchor_at - 1, -1, -1) if not is_library(cls.frames[i])), anchor_at)
    anchor = cls.frames[anchor_at]
    if detailed:
        shown = [f.full() for f in reversed(cls.frames[anchor_at:])]
        return " <- ".join(shown if len(shown) <= 4 else [*shown[:2], "...", *shown[-2:]])
    if anchor_at == len(cls.frames) - 1:
        return anchor.where()
    return f"{innermost.function} <- {anchor.where()}"


def _program_frame(frames: Sequence[Frame]) -> int:
    """The innermost frame of the program itself (not Python's nor a library's); else the outermost."""
    for index in range(len(frames) - 1, -1, -1):
        if not is_library(frames[index]):
            return index
    return 0


def ranges(numbers: Iterable[int]) -> str:
    """``0-3,7,9-10`` from distinct numbers."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
