"""What a node says about itself (``launcher.node.facts.collect``), parsed once into one typed, bounded value.

A node's answer is untrusted input (DESIGN 8): a backend parses it where it receives it
(``NodeFacts.parse`` of the decoded JSON, ``NodeFacts.from_json`` of the line) and every reader uses
attributes. A key the request did not ask for is absent and takes its default (None, empty,
``workdir_ok`` True, as before); an unknown key is ignored; a value of the wrong type, a number out
of range or a list past its bound is a ``FactsError`` naming the field, which the backend reports as
that node's problem (never a traceback). Strings are cut to a bound, and names (hostnames,
interfaces, modules, versions) are kept to one line; error texts and paths keep their characters.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

NAME_LIMIT = 200  # characters of a name (one line)
TEXT_LIMIT = 1000  # characters of an error text or a path
LINE_LIMIT = 1000  # characters of one kernel log line
NAMES_LIMIT = 64  # modules, interfaces, HCAs, GPUs on one node
PYTHONS_LIMIT = 512  # candidate interpreters (a node with many environments)
KERNEL_LOG_LIMIT = 2000  # lines (the node sends its last 500)
COUNT_LIMIT = 2**63  # any count or size in bytes
SHOWN_ERRORS = 3


class FactsError(ValueError):
    """A node's facts answer that does not parse; the message names the fields (never their values)."""


def _name(value: str) -> str:
    return " ".join(value.split())[:NAME_LIMIT]


def _text(value: str) -> str:
    return value[:TEXT_LIMIT]


def _line(value: str) -> str:
    return value[:LINE_LIMIT]


Name = Annotated[StrictStr, AfterValidator(_name)]
Text = Annotated[StrictStr, AfterValidator(_text)]
Line = Annotated[StrictStr, AfterValidator(_line)]
Count = Annotated[int, Field(strict=True, ge=0, le=COUNT_LIMIT)]
Amount = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Limit = Annotated[int, Field(strict=True, ge=-1, le=2**64)]  # an rlimit in bytes, -1 for unlimited


class _Facts(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class GPUFacts(_Facts):
    """One GPU as nvidia-smi lists it."""

    name: Name | None = None
    driver: Name | None = None
    total_mb: Amount = 0.0
    used_mb: Amount = 0.0


class BuildLock(_Facts):
    """A torch JIT build lock file on the node (``launcher.node.facts.build_locks``) and its age."""

    path: Text
    age_s: Amount


class ContainerFacts(_Facts):
    """The container runtime, the image and the interpreter inside it: what went wrong, if anything."""

    runtime_error: Text | None = None
    image_error: Text | None = None
    inside_error: Text | None = None
    #: the image was checked with InfiniBand's options (the node has HCAs): what its container got
    ib_checked: StrictBool = False
    memlock: Limit | None = None  # bytes, -1 unlimited
    ib_devices: tuple[Name, ...] | None = Field(None, max_length=NAMES_LIMIT)


class PythonFacts(_Facts):
    """One candidate interpreter (``launcher.node.pythons.survey``): its answers, or why it gave none."""

    path: Text | None = None
    error: Text | None = None
    executable: Text | None = None
    prefix: Text | None = None
    version: Name | None = None
    torch: Name | None = None
    deepspeed: Name | None = None
    imports_torch: StrictBool | None = None  # None: not tried (no torch listed)
    import_error: Text | None = None


class NodeFacts(_Facts):
    """A node's facts answer. Which keys it has depends on the request (see ``launcher.node.facts``)."""

    hostname: Name | None = None
    python: Name | None = None
    executable: Text | None = None
    torch: Name | None = None
    deepspeed: Name | None = None
    nccl: Name | None = None
    launch: Name | None = None
    cpus: Count | None = None
    mem_total_bytes: Count | None = None
    mem_available_bytes: Count | None = None
    missing: tuple[Name, ...] = Field((), max_length=NAMES_LIMIT)
    workdir_ok: StrictBool = True
    run_root_error: Text | None = None  # why the root of the job's run directories cannot be used
    disk_free_gb: Amount | None = None
    missing_ifaces: tuple[Name, ...] = Field((), max_length=NAMES_LIMIT)
    hcas: tuple[Name, ...] = Field((), max_length=NAMES_LIMIT)
    memlock: Limit | None = None  # this node's memlock limit in bytes, -1 unlimited
    memlock_max: Limit | None = None  # the largest a process there may set (-1: unlimited)
    ib_devices: tuple[Name, ...] | None = Field(None, max_length=NAMES_LIMIT)  # /dev/infiniband's entries
    hostname_resolves: StrictBool | Text | None = None  # True, or why not
    gpus: tuple[GPUFacts, ...] = Field((), max_length=NAMES_LIMIT)
    gpu_error: Text | None = None
    gpu_processes: Count = 0
    dev: Name | None = None  # the interface routing to node 0
    source: Name | None = None  # this node's address on that route
    route_error: Text | None = None
    port_free: StrictBool | None = None
    accepted: Count | None = None
    reached: StrictBool | Text | None = None  # True, or why not
    kernel_log: tuple[Line, ...] = Field((), max_length=KERNEL_LOG_LIMIT)
    build_locks: tuple[BuildLock, ...] = Field((), max_length=NAMES_LIMIT)
    container: ContainerFacts | None = None
    pythons: tuple[PythonFacts, ...] = Field((), max_length=PYTHONS_LIMIT)
    time: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None
    slurm_node: Name | None = None  # a Slurm node's name, and node 0's address it probed (slurmnode)
    master: Name | None = None

    @property
    def settable_memlock(self) -> int:
        """The largest memlock limit a process on the node may set, in bytes (-1: unlimited, or not reported)."""
        return -1 if self.memlock_max is None else self.memlock_max

    @classmethod
    def parse(cls, raw: object) -> NodeFacts:
        """The typed facts of a decoded answer; FactsError names what is wrong with it."""
        if not isinstance(raw, dict):
            raise FactsError(f"malformed facts answer: a JSON object was expected, not {_kind(raw)}")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise FactsError(f"malformed facts answer: {_describe(exc)}") from None
        except RecursionError:
            raise FactsError("malformed facts answer: nested too deeply") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeFacts:
        """The typed facts of an answer's JSON text."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            raise FactsError("malformed facts answer: not JSON") from None
        return cls.parse(raw)

    def as_json(self) -> dict[str, Any]:
        """The keys the node sent (that this side knows), as JSON values: what `launch check --json` prints."""
        return self.model_dump(mode="json", exclude_unset=True)


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null"}.get(type(value), "another value")


_FIELDS = {name for model in (NodeFacts, GPUFacts, ContainerFacts, PythonFacts) for name in model.model_fields}


def _describe(exc: ValidationError) -> str:
    """The fields that failed (``gpus.0.total_mb``) and why, one entry a field; the values are never shown."""
    why: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        path = ".".join(str(part) for part in error["loc"] if isinstance(part, int) or part in _FIELDS)
        why.setdefault(path or "the answer", []).append(error["msg"].replace("Tuple", "List").replace("tuple", "list"))
    shown = [f"{path}: {msgs[0] if len(msgs) == 1 else 'wrong type'}" for path, msgs in list(why.items())[:SHOWN_ERRORS]]
    more = f" (and {len(why) - SHOWN_ERRORS} more)" if len(why) > SHOWN_ERRORS else ""
    return "; ".join(shown) + more
