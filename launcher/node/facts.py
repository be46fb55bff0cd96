"""What a node says about itself, for preflight, `launch check` and `launch init`.

One request, one JSON answer, the same on every backend. The request names what to look at:
modules the job's interpreter must import, the workdir, pinned interfaces, the rendezvous port
(free here? listen on it for the reachability test, or connect to node 0's), node 0's address (the
interface and source address that route to it), GPUs, the kernel log, torch's build locks, and (``pythons``) the
interpreters that could run training (see ``pythons.survey``, which imports torch in the candidates
that list it). Package versions are read from metadata, so the facts themselves import nothing
heavy (not even ``importlib.metadata`` where every distribution asked for is a ``.dist-info``: ``version``).
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time

from . import rundir
from .protocol import ContainerCheck, FactsRequest, RequestError

IB_CLASS_DIR = "/sys/class/infiniband"
IB_DEVICES = "/dev/infiniband"
CAP_SYS_RESOURCE = 24
MEMLOCK_OPTION = "memlock=-1"  # as the plan writes it in a container's --ulimit; lowered here to what the node allows
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
KERNEL_LOG_LINES = 500
BUILD_LOCKS_LIMIT = 16
PULL_TIMEOUT_S = 1800.0
INSIDE_TIMEOUT_S = 300.0


def run(argv: list[str], timeout: float = 10.0) -> tuple[str | None, str | None]:
    """(stdout, None) of a successful command, else (None, why)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode:
        return None, (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"
    return done.stdout, None


def version(*names: str) -> str | None:
    """The version of the first of the distributions ``names`` installed for this interpreter, as
    ``importlib.metadata.version`` says it: read from the METADATA of the first ``.dist-info`` that sys.path's
    directories hold for it (``_installed``), as that module finds it; that module itself (about 25 ms of CPU to
    import, in every preflight's probe) only for a distribution whose first find is another kind (an ``.egg-info``)."""
    for name in names:
        found = _installed().get(_normalized(name))
        if found is None:
            continue
        if found.lower().endswith(".dist-info"):
            text = _metadata_version(found)
            if text is not None:
                return text
        import importlib.metadata as metadata

        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _normalized(name: str) -> str:
    """A distribution's name as importlib.metadata matches it: lower case, each run of ``-``, ``_``, ``.`` one ``_``."""
    text = name.lower().replace("-", "_").replace(".", "_")
    while "__" in text:
        text = text.replace("__", "_")
    return text


@functools.cache
def _installed() -> dict[str, str]:
    """Normalized distribution name -> the first ``.dist-info`` or ``.egg-info`` directory for it along sys.path."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            children = os.listdir(entry or ".")
        except OSError:
            continue  # gone, not a directory (a zip: nothing of the job's is installed there)
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                found.setdefault(_normalized(low.rpartition(".")[0].partition("-")[0]), os.path.join(entry, child))
    return found


def _metadata_version(folder: str) -> str | None:
    """The ``Version:`` header of ``folder``'s METADATA (None: unreadable, or none before the headers end)."""
    try:
        with open(os.path.join(folder, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    return None
                if line.lower().startswith("version:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def gpus() -> tuple[list[dict], str | None]:
    """The node's GPUs from nvidia-smi (name, driver, memory), or ([], why not)."""
    text, error = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                       "--format=csv,noheader,nounits"])
    if text is None:
        return [], error
    found = []
    for line in text.strip().splitlines():
        name, driver, total, used = (part.strip() for part in line.split(","))
        found.append({"name": name, "driver": driver, "total_mb": float(total), "used_mb": float(used)})
    return found, None


def gpu_processes() -> int:
    text, _ = run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    return len((text or "").split())


def route_to(address: str) -> tuple[str | None, str | None, str | None]:
    """(interface, source address, problem) this node uses to reach ``address``.

    For an address of this node: the interface that holds it (not ``lo``, which the kernel
    reports for local routes).
    """
    try:
        resolved = socket.gethostbyname(address)
    except OSError as exc:
        return None, None, f"cannot resolve {address}: {exc}"
    text, error = run(["ip", "-o", "route", "get", resolved])
    words = (text or "").split()
    if not words:
        return None, None, error or "no route"
    source = words[words.index("src") + 1] if "src" in words else None
    if words[0] == "local":
        owners, _ = run(["ip", "-o", "-4", "addr", "show", "to", resolved])
        if owners:
            return owners.split()[1].split("@")[0], resolved, None
    if "dev" not in words:
        return None, source, "no route"
    return words[words.index("dev") + 1], source, None


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def listen(port: int, seconds: float, expect: int) -> int | None:
    """Listen on ``port`` for ``seconds`` or ``expect`` connections; how many came (None: port busy)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return None
        sock.listen(64)
        print(json.dumps({"listening": True}), flush=True)
        deadline = time.time() + seconds
        accepted = 0
        while accepted < expect and time.time() < deadline:
            sock.settimeout(max(0.01, deadline - time.time()))
            try:
                sock.accept()[0].close()
                accepted += 1
            except OSError:
                break
        return accepted


def reach(address: str, port: int, wait: float) -> bool | str:
    """True once a TCP connection to node 0's port succeeds (retried for ``wait`` s), else why not."""
    deadline = time.time() + wait
    while True:
        try:
            socket.create_connection((address, port), timeout=5).close()
            return True
        except OSError as exc:
            if time.time() >= deadline:
                return str(exc)
            time.sleep(0.2)


def memory_bytes() -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) of this node in bytes."""
    values = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None, None
    return values.get("MemTotal"), values.get("MemAvailable")


def kernel_log(since: float | None = None) -> list[str]:
    """The last kernel log lines with ISO times (for OOM-killer and Xid lines); [] if unreadable."""
    text, _ = run(["dmesg", "--time-format", "iso"])
    if text is None:
        text, _ = run(["dmesg"])
    return (text or "").splitlines()[-KERNEL_LOG_LINES:]


def _limit(value: int) -> int:
    return -1 if value == resource.RLIM_INFINITY else value


def memlock() -> tuple[int, int]:
    """(this process's memlock limit, the largest it may set), in bytes, -1 for unlimited: the hard limit unless
    the process has CAP_SYS_RESOURCE (then unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        with open("/proc/self/status") as handle:
            caps = next((int(line.split()[1], 16) for line in handle if line.startswith("CapEff:")), 0)
    except (OSError, ValueError, IndexError):
        caps = 0
    return _limit(soft), -1 if caps >> CAP_SYS_RESOURCE & 1 else _limit(hard)


def ib_devices() -> list[str] | None:
    """The entries of /dev/infiniband (uverbs*, rdma_cm), None where there is none."""
    try:
        return sorted(os.listdir(IB_DEVICES))
    except OSError:
        return None


def _lowered(argv: list[str], memlock_max: int) -> list[str]:
    """``argv`` with the plan's unlimited memlock lowered to ``memlock_max`` where the node cannot raise it."""
    if memlock_max == -1:
        return argv
    return [f"memlock={memlock_max}:{memlock_max}" if arg == MEMLOCK_OPTION else arg for arg in argv]


def container_facts(req: ContainerCheck, hcas: list[str], memlock_max: int) -> dict:
    """The container runtime's state on this node, the image (pulled as the request says), and the facts
    of the interpreter inside the image (``inside``: a facts command run in a container of it)."""
    out: dict = {}
    _, error = run(list(req.probe), timeout=30)
    if error:
        return {"runtime_error": error}
    present = subprocess.run(req.present, capture_output=True, timeout=60).returncode == 0
    if req.pull_argv is not None and (req.pull == "always" or (not present and req.pull == "missing")):
        _, error = run(list(req.pull_argv), timeout=PULL_TIMEOUT_S)
        if error:
            return {"image_error": f"pulling the image failed: {error}"}
    elif not present:
        return {"image_error": "the image is not on this node (pull: never)"}
    ib = bool(hcas and req.ib_options)  # run as the job's container will be: with what IB needs
    inside = list(req.inside)
    if ib and req.ib_options:  # right after `docker run` / `podman run`
        inside = [*inside[:2], *_lowered(list(req.ib_options), memlock_max), *inside[2:]]
    text, error = run(inside, timeout=INSIDE_TIMEOUT_S)
    lines = [line for line in (text or "").splitlines() if line.startswith("{")]
    if error or not lines:
        return {"inside_error": f"the interpreter inside the image could not run: {error or 'no answer'}"}
    out["inside"] = json.loads(lines[-1])
    if ib:
        out["ib_checked"] = True
        out["memlock"], out["ib_devices"] = out["inside"].get("memlock"), out["inside"].get("ib_devices")
    return out


def build_locks(root: str | None) -> list[dict]:
    """torch's JIT build lock files in the extension cache ``root`` (None: where torch puts it for this user),
    each with its age in seconds, oldest first. torch creates one while it checks or builds an op (DeepSpeed's
    cpu_adam, its comm op...) and a killed build leaves it: every later load of that op then waits on it for ever
    (pytorch/pytorch#189245). Preflight judges which are stale."""
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(cache, "torch_extensions")
    found: list[tuple[float, str]] = []
    now = time.time()
    for pattern in ("*/lock", "*/*/lock"):  # <root>/<op>/lock, or <root>/py311_cu121/<op>/lock (torch's default)
        for path in glob.glob(os.path.join(glob.escape(root), pattern)):
            try:
                found.append((round(max(0.0, now - os.stat(path).st_mtime), 1), path))
            except OSError:
                continue  # released as we looked
    oldest = sorted(found, key=lambda lock: -lock[0])[:BUILD_LOCKS_LIMIT]
    return [{"path": path, "age_s": age} for age, path in oldest]


def run_root_error() -> str | None:
    """Why the root of this user's new run directories cannot be used (another user's ``$XDG_RUNTIME_DIR/launch``,
    an own root open to others, a /tmp others may change without its sticky bit), naming it and its owner; None when
    it can (made now, mode 0700, if missing)."""
    try:
        rundir.private_dir(rundir.run_root())
    except (rundir.RunDirError, OSError) as exc:
        return str(exc)[:500]
    return None


def collect(req: FactsRequest) -> dict:
    """The answer to a facts request (see the module docstring)."""
    out: dict = {
        "hostname": socket.gethostname(), "python": sys.version.split()[0], "executable": sys.executable,
        "torch": version("torch"), "deepspeed": version("deepspeed"), "nccl": version(*NCCL_PACKAGES),
        "launch": version("launch"), "cpus": len(os.sched_getaffinity(0)),
    }
    out["mem_total_bytes"], out["mem_available_bytes"] = memory_bytes()
    out["missing"] = [m for m in req.modules if not importable(m)]
    workdir = req.workdir
    out["workdir_ok"] = workdir is None or os.path.isdir(workdir)
    if req.run_root:  # a job's preflight or check: the root of its run directories must be this user's, closed to others
        out["run_root_error"] = run_root_error()
    out["disk_free_gb"] = shutil.disk_usage(workdir if workdir and out["workdir_ok"] else os.path.expanduser("~")).free / 1e9
    out["missing_ifaces"] = [n for n in req.ifaces if not os.path.exists("/sys/class/net/" + n)]
    out["hcas"] = sorted(os.listdir(IB_CLASS_DIR)) if os.path.isdir(IB_CLASS_DIR) else []
    out["memlock"], out["memlock_max"] = memlock()
    out["ib_devices"] = ib_devices()
    if req.resolve_self:
        try:
            socket.getaddrinfo(socket.gethostname(), None)
            out["hostname_resolves"] = True
        except OSError as exc:
            out["hostname_resolves"] = str(exc)
    if req.gpus:
        out["gpus"], out["gpu_error"] = gpus()
        out["gpu_processes"] = gpu_processes() if out["gpus"] else 0
    if req.master:
        out["dev"], out["source"], out["route_error"] = route_to(req.master)
    port = req.port
    if port and req.listen_s:
        accepted = listen(port, req.listen_s, req.expect)
        out["port_free"], out["accepted"] = accepted is not None, accepted
    elif port and req.connect:
        out["reached"] = reach(req.connect, port, req.wait_s)
    elif port:
        out["port_free"] = port_free(port)
    if req.kernel_log:
        out["kernel_log"] = kernel_log()
    if req.build_locks:
        out["build_locks"] = build_locks(req.extensions_dir)
    if req.container is not None:
        out["container"] = container_facts(req.container, out["hcas"], out["memlock_max"])
        inside = out["container"].get("inside")
        if inside:  # what the job will run with is the image's, not this host's
            out.update({key: inside.get(key) for key in ("python", "executable", "torch", "deepspeed", "nccl", "missing")})
    if req.pythons is not None:
        from . import pythons  # its thread pool's imports only where interpreters are surveyed

        out["pythons"] = pythons.survey(req.pythons)
    out["time"] = time.time()
    return out


def answer(req: FactsRequest) -> dict:
    """The facts of ``collect``; with a ``leases`` request, the answer of ``leases`` too (one probe a host, not two)."""
    out = collect(req)
    if req.leases is not None:
        from . import waiting

        out["leases"] = waiting.answer(req.leases)
    return out


def main(text: str) -> FactsRequest | None:
    """``facts REQUEST_JSON`` (``protocol.FactsRequest``): the answer on stdout, and the request; None for a request
    this node side cannot read (said on stderr)."""
    try:
        req = FactsRequest.from_json(text)
    except RequestError as exc:
        print(f"launch node side: facts: {exc}", file=sys.stderr, flush=True)
        return None
    print(json.dumps(answer(req)), flush=True)
    return req
