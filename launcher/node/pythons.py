"""Which interpreters on this node could run training: found where people install them, then asked.

``survey(request)`` looks for candidates (``python3``/``python`` on PATH, conda under /opt/conda,
~/miniconda3, ~/anaconda3 and ~/miniforge3 with their envs, ~/.venv and ~/venv, pyenv versions
under ~/.pyenv, ~/.local/bin) plus the paths the request names, asks each for its version and its
torch and deepspeed versions (package metadata: fast, nothing imported), then imports torch in
those that claim it, since an install can be broken. Standard library only: it runs on nodes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from .protocol import PythonsSurvey
from .safepath import SAFE_PATH

ASK_TIMEOUT_S = 20.0
IMPORT_TIMEOUT_S = 60.0
PARALLEL = 4
CONDA_ROOTS = ("/opt/conda", "~/miniconda3", "~/anaconda3", "~/miniforge3")
VENVS = ("~/.venv", "~/venv")

# Runs under each candidate, however old: Python 2 and 3.6 answer with their version and no packages.
# Both start by taking the current directory ('' under -c) off sys.path: a json.py or torch.py there is not theirs.
ASK = SAFE_PATH + """
import json
try:
    from importlib.metadata import version
except ImportError:
    version = None
def installed(name):
    try:
        return version(name) if version else None
    except Exception:
        return None
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix,
                  "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
                  "torch": installed("torch"), "deepspeed": installed("deepspeed")}))
"""
IMPORT_TORCH = SAFE_PATH + "; import torch; print(torch.__version__)"


def candidates(extra: list[str], search: bool) -> list[str]:
    """Absolute paths that exist, in order of preference among equals, without repeats."""
    found = list(extra)
    if search:
        found += [path for name in ("python3", "python") if (path := shutil.which(name))]
        for root in CONDA_ROOTS:
            root = os.path.expanduser(root)
            found += [os.path.join(root, "bin", "python")] + sorted(glob.glob(os.path.join(root, "envs", "*", "bin", "python")))
        found += [os.path.join(os.path.expanduser(venv), "bin", "python") for venv in VENVS]
        found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python")), reverse=True)
        found.append(os.path.expanduser("~/.local/bin/python3"))
    usable = [p for p in found if os.path.isabs(p) and os.path.isfile(p) and os.access(p, os.X_OK)]
    return list(dict.fromkeys(usable))


def _run(argv: list[str], timeout: float) -> tuple[str | None, str | None]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return None, str(exc)
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, lines[-1][-300:] if lines else f"exit {done.returncode}"
    return done.stdout, None


def ask(path: str) -> dict:
    """What ``path`` says about itself: version, torch, deepspeed (or an error)."""
    out, error = _run([path, "-c", ASK], ASK_TIMEOUT_S)
    if out is None:
        return {"path": path, "error": error}
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"path": path, "error": "unreadable answer"}
    return {"path": path, **{k: answer.get(k) for k in ("executable", "prefix", "version", "torch", "deepspeed")}}


def imports_torch(path: str) -> tuple[bool, str | None]:
    """(True, None) when ``import torch`` works under ``path``, else (False, why)."""
    out, error = _run([path, "-c", IMPORT_TORCH], IMPORT_TIMEOUT_S)
    return out is not None, error


def survey(request: PythonsSurvey) -> list[dict]:
    """Every candidate with its answers; ``imports_torch`` is set for those whose metadata lists torch."""
    paths = candidates(list(request.paths), request.search)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        answers = list(pool.map(ask, paths))
        seen, unique = set(), []
        for answer in answers:
            identity = (os.path.realpath(answer.get("executable") or answer["path"]), answer.get("prefix"))
            if answer.get("error") is None and identity in seen:
                continue
            seen.add(identity)
            unique.append(answer)
        with_torch = [a for a in unique if a.get("torch")]
        for answer, (ok, error) in zip(with_torch, pool.map(imports_torch, [a["path"] for a in with_torch])):
            answer["imports_torch"], answer["import_error"] = ok, error
    return unique
