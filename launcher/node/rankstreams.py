"""DeepSpeed's per-node launcher with each rank's output on a pipe of its own.

Unchanged, DeepSpeed's launcher lets every rank inherit its stdout: one pipe, no rank on a line, and
two ranks' lines merged where print() wrote a text and its newline apart. ``with_rank_streams`` runs
the launcher through ``rankrelay`` instead (a ``-c`` program that carries it and ``linecut``): each rank's
whole lines behind ``[RANK]: ``, as torchrun's tee does. Standard library only: it runs on nodes.
"""

from __future__ import annotations

import base64
import functools
import json
import types

from . import linecut
from .safepath import SAFE_PATH

DEEPSPEED_LAUNCH = ("-m", "deepspeed.launcher.launch")  # launcher.plan.commands.DEEPSPEED_MODULE, as the plan writes it

# Runs in the launcher's interpreter (``python -u -c PROGRAM ...``): ``linecut`` and ``rankrelay`` made a package
# there from their sources, as the node side's BOOT does for the agent, then ``rankrelay.main()``.
_BOOT = """
import json, types
sources = json.loads({sources!r})
sys.modules["launch_relay"] = package = types.ModuleType("launch_relay")
package.__path__ = []
for name in ("linecut", "rankrelay"):
    module = types.ModuleType("launch_relay." + name)
    module.__package__ = "launch_relay"
    sys.modules[module.__name__] = module
    exec(compile(sources[name], "<launch rank relay: " + name + ">", "exec"), module.__dict__)
sys.modules["launch_relay.rankrelay"].main()
"""


def _source(module: types.ModuleType) -> str:
    """A node module's source, from its loader (a file here, the shipped sources on a node)."""
    source = module.__loader__.get_source(module.__name__) if module.__loader__ is not None else None  # type: ignore[attr-defined]
    if source is None:
        raise RuntimeError(f"no source for {module.__name__}")
    return source


@functools.cache
def program() -> str:
    """The ``-c`` program that runs DeepSpeed's launcher through ``rankrelay``."""
    from . import rankrelay  # compiled only where a job runs DeepSpeed's launcher

    sources = {"linecut": _source(linecut), "rankrelay": _source(rankrelay)}
    return SAFE_PATH + _BOOT.format(sources=json.dumps(sources))


def with_rank_streams(argv: list[str]) -> list[str]:
    """``argv`` with DeepSpeed's launcher run through ``rankrelay`` (each rank's lines whole and prefixed); else as is."""
    for at in range(len(argv) - 1):
        if (argv[at], argv[at + 1]) == DEEPSPEED_LAUNCH:
            return [*argv[:at], "-c", program(), *argv[at + 2:]]
    return list(argv)


def on_devices(argv: list[str], devices: list[int]) -> list[str]:
    """``argv`` with DeepSpeed's launcher given this node's leased GPUs: it sets CUDA_VISIBLE_DEVICES itself, from
    its ``--world_info`` entry for ``--node_rank`` (the plan's 0..n-1), over the agent's. Other commands as they are."""
    if not any((argv[at], argv[at + 1]) == DEEPSPEED_LAUNCH for at in range(len(argv) - 1)):
        return list(argv)
    rank = next((arg.partition("=")[2] for arg in argv if arg.startswith("--node_rank=")), "")
    shown = []
    for arg in argv:
        if arg.startswith("--world_info=") and rank.isdigit():
            world = json.loads(base64.urlsafe_b64decode(arg.partition("=")[2]))
            node = list(world)[int(rank)]
            if len(world[node]) == len(devices):
                world[node] = list(devices)
            arg = "--world_info=" + base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
        shown.append(arg)
    return shown
