"""Send the node side (``launcher.node``) to a node as an argv: ``python -c BOOT PAYLOAD COMMAND REQUEST``.

A request that may be large (the agent's: the job's env) travels instead as the first line of the
command's stdin (``stdin_argv`` and ``stdin_request``): Linux refuses a single argument over 128 KiB.

PAYLOAD is the package's module sources, zlib-compressed and base64-encoded; BOOT, a few lines
of Python, makes them importable as the package ``launch_node`` in that one process (the modules
import each other relatively) and runs COMMAND. A module is compiled when it is first imported, so
a command pays for the modules it uses (``facts`` compiles 4 of them, ``protocol`` for its typed request; compiling
all of them took about 35 ms of every node command). No file is written and nothing needs installing on the node but
a Python 3.10+; a ``launcher`` the node may have installed is left alone. BOOT first takes the current directory
(``''``, first on ``sys.path`` under ``-c``) off the path (``safepath``): the agent starts in the job's workdir, where
a co-tenant's ``json.py`` would otherwise run as the job's user (the ranks' own program still sees its directory). Every command but ``facts`` and ``slurm``
(which read the job interpreter's installed packages) uses the standard library alone and starts without ``site``
(``-S``): in a virtualenv, site's processing of its .pth files was about 25 ms of CPU a start. Over SSH, the facts
probe of a job that starts at once becomes the node's agent (``FactsRequest.agent_within_s``): one interpreter, with
site, starts the job on each node.
"""

from __future__ import annotations

import base64
import functools
import json
import zlib
from pathlib import Path

from launcher.node.main import REQUEST_ON_STDIN
from launcher.node.protocol import FactsRequest, Request
from launcher.node.safepath import SAFE_PATH

NODE_MODULES = ("proctree", "pythons", "facts", "rankstreams", "journal", "gpuapps", "records", "progress", "leases", "waiting",
                "rendezvous", "rundir", "subreaper", "nccl", "sampler", "timelimit", "agent", "follow", "stacks", "slurmnode",
                "main", "protocol", "linecut", "safepath", "torchelastic", "secretmask", "rankrelay")

PACKAGE = "launch_node"
BOOT = SAFE_PATH + """
import base64, json, types, zlib
from importlib.machinery import ModuleSpec
SOURCES = dict(json.loads(zlib.decompress(base64.b64decode(sys.argv[1]))))
class NodeSide:
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        return ModuleSpec(fullname, self) if package == "launch_node" and name in SOURCES else None
    def create_module(self, spec):
        return None
    def get_source(self, fullname):
        return SOURCES[fullname.partition(".")[2]]
    def exec_module(self, module):
        name = module.__name__.partition(".")[2]
        exec(compile(SOURCES[name], "<launch node side: " + name + ">", "exec"), module.__dict__)
sys.modules["launch_node"] = package = types.ModuleType("launch_node")
package.__path__ = []
sys.meta_path.insert(0, NodeSide())
from launch_node import main
sys.exit(main.main(sys.argv[2:]))
"""


# What the facts probe alone reads (no leases asked): what a container's probe ships, inside another node command's
# request, whose one argument Linux caps at 128 KiB (the whole node side twice went over it).
FACTS_MODULES = ("main", "facts", "pythons", "rundir", "safepath", "protocol")


@functools.cache
def payload(modules: tuple[str, ...] = NODE_MODULES) -> str:
    """The sources of ``modules`` (every node module), packed for BOOT (computed once a process)."""
    folder = Path(__file__).parent
    sources = [(name, (folder / f"{name}.py").read_text(encoding="utf-8")) for name in modules]
    return base64.b64encode(zlib.compress(json.dumps(sources).encode(), 9)).decode()


# The node commands that read the job interpreter's installed packages (versions, importable modules): the facts
# probe, and Slurm's node side, which probes its node's facts inside the allocation before it starts the agent.
NEEDS_SITE = frozenset({"facts", "slurm"})


def _interpreter(python: str, command: str) -> list[str]:
    return [python] if command in NEEDS_SITE else [python, "-S"]


def _text(request: Request | dict) -> str:
    return json.dumps(request.to_json() if isinstance(request, Request) else request, separators=(",", ":"))


def node_argv(python: str, command: str, request: Request | dict) -> list[str]:
    """The argv that runs ``command`` (facts, agent, follow, slurm, list, end, stacks) with ``request`` (typed in
    ``launcher.node.protocol``; a plain dict only where a test sends what no launcher would) under ``python``."""
    return [*_interpreter(python, command), "-c", BOOT, payload(), command, _text(request)]


def facts_argv(python: str, request: FactsRequest) -> list[str]:
    """``node_argv`` of the facts probe shipping only FACTS_MODULES: the probe a container of the job's image runs,
    carried inside the node's own facts request (a ``leases`` key would not be answered)."""
    return [*_interpreter(python, "facts"), "-c", BOOT, payload(FACTS_MODULES), "facts", _text(request)]


def stdin_argv(python: str, command: str) -> list[str]:
    """The argv that runs ``command`` under ``python`` with its request read from the first line of stdin."""
    return [*_interpreter(python, command), "-c", BOOT, payload(), command, REQUEST_ON_STDIN]


# The ranks' start-up hook and the step hooks it installs, as the agent writes them in the run directory's
# ``pyhooks`` folder (``agent.write_step_hooks``): file name on the node, module here.
STEP_HOOK_FILES = (("sitecustomize.py", "sitehook"), ("launch_stephooks.py", "stephooks"))


@functools.cache
def step_hook_files() -> dict[str, str]:
    """The step hooks' files (name on the node -> source), for an agent request's ``step_hooks``."""
    folder = Path(__file__).parent
    return {name: (folder / f"{module}.py").read_text(encoding="utf-8") for name, module in STEP_HOOK_FILES}


def stdin_request(request: Request) -> bytes:
    """``request`` as the first stdin line of a ``stdin_argv`` command (the agent's secrets, if any, follow it)."""
    return _text(request).encode() + b"\n"
