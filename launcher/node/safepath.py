"""Launch's own interpreters on a node never put the current directory first on ``sys.path``.

The agent, ``follow`` and every node command start in the job's workdir, which other users may write to (a shared
project directory): a ``json.py`` or ``launcher/`` there would run as the job's user inside launch's own processes.
``SAFE_PATH`` is the line that takes ``''`` (the current directory, first under ``-c``) off the path at the top of a
``-c`` program: the node commands' BOOT, the interpreter probes, DeepSpeed's launcher as ``rankstreams`` runs it.
``isolated`` runs torchrun (``python -m torch.distributed.run``) as such a program, in any Python (``-P`` needs 3.11).
The ranks' own program is left as Python runs it: its script's directory first on its path, as usual.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

SAFE_PATH = "import sys; sys.path[:] = [entry for entry in sys.path if entry]"
TORCHRUN = ("-m", "torch.distributed.run")  # launcher.plan.commands.TORCHRUN_MODULE, as the plan writes it
TORCHRUN_ISOLATED = SAFE_PATH + "\nfrom torch.distributed.run import main\nmain()\n"


def isolated(argv: list[str]) -> list[str]:
    """``argv`` with torchrun's ``-m torch.distributed.run`` run as ``TORCHRUN_ISOLATED``; else as it is."""
    for at in range(len(argv) - 1):
        if (argv[at], argv[at + 1]) == TORCHRUN:
            return [*argv[:at], "-c", TORCHRUN_ISOLATED, *argv[at + 2:]]
    return list(argv)
