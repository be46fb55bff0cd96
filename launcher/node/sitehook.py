"""The ranks' start-up hook: written by the node agent as ``sitecustomize.py`` in the run directory's ``pyhooks``
folder, which the agent puts first on the ranks' ``PYTHONPATH`` (``agent.write_step_hooks``).

Python's ``site`` imports it in every process of the job that starts with site (torchrun, the ranks, their
helpers). It imports nothing but what ``site`` already loaded and adds one meta-path finder that answers only for
``torch``: until a process imports torch it costs that process nothing more. When a rank (a process with
``LOCAL_RANK`` set: not torchrun's own agent) imports torch, the finder runs torch's own loader and then installs
launch's step hooks (``launch_stephooks``, beside this file). ``LAUNCH_METRICS=0`` turns them off.
A ``sitecustomize`` of the user's own (later on ``sys.path``: a virtualenv's, the system's) still runs, after this.

In a rank it also sends stderr where stdout goes (``os.dup2(1, 2)``, whatever ``LAUNCH_METRICS`` says): torchrun's
``--tee`` writes each stream of a rank to a file of its own and tails the two apart, which loses their order (a
last line printed before earlier warnings); as one stream, lines keep the order the program wrote them, Python's and
C's alike. The node agent read the two as one anyway. Under DeepSpeed's launcher they are one pipe already.
Standard library only: it runs in the user's interpreter, where launch need not be installed.
"""

import os
import sys


class _TorchWatch:
    """Finds nothing itself: on ``import torch`` it lets the other finders find torch, then hooks its loading."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: torch is imported once a process
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_hook(module):
            exec_module(module)
            _install(module)

        try:
            loader.exec_module = exec_then_hook  # this loader object only: torch's __loader__ stays its own
        except AttributeError:
            pass
        return spec


def _install(torch):
    """Install the step hooks in this rank; a failure is said on stderr and never stops the program."""
    del torch
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, here)
        try:
            import launch_stephooks
        finally:
            sys.path.remove(here)
        launch_stephooks.install()
    except Exception as exc:  # noqa: BLE001 - the user's program runs on without launch's figures
        sys.stderr.write(f"launch: step hooks not installed ({type(exc).__name__}: {exc}); metrics from outside only\n")


def _chain():
    """Run the user's own ``sitecustomize`` (the next one on ``sys.path``), as ``site`` would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _one_stream():
    """This rank's stderr onto its stdout, unless they are one file already (or either is closed)."""
    try:
        out, err = os.fstat(1), os.fstat(2)
        if (out.st_dev, out.st_ino) != (err.st_dev, err.st_ino):
            os.dup2(1, 2)
    except OSError:
        pass


if os.environ.get("LOCAL_RANK") is not None:
    _one_stream()
    if os.environ.get("LAUNCH_METRICS", "1") != "0" and "torch" not in sys.modules:
        sys.meta_path.insert(0, _TorchWatch())
_chain()
