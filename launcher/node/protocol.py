"""The wire protocol between a node's agent and its readers: framed lines, and the typed requests of node commands.

Every line a node agent reports (journaled, then sent on its stdout), every line ``follow`` prints, is
one framed line (UTF-8, no newline inside), stamped with the node's own clocks, ``MONO`` (its
monotonic clock, for durations: comparable between the processes of one boot of one node) and
``WALL`` (its wall clock, for display), both in seconds with three decimals::

    |MONO WALL TEXT      a line of output: a rank's (untrusted) or the agent's own (``launch: ...``)
    @KIND MONO WALL JSON  a frame: KIND one of ``FrameKind``, JSON an object
    ~LINE                 either of them sent live only: not in the node's journal (full, or unwritable)

Ranks cannot forge a frame: everything they print is relayed as output, behind ``|``. A reader counts the
lines it received that the journal has (``journaled``): a live line is not one. ``parse`` reads
any line (a rank's output is untrusted and a stream may be cut): it never raises, and bounds what it
reads; a line that is neither (an interpreter's traceback before the agent ran) is output without
node times. ``encode_frame`` and ``encode_output`` are the only writers of the grammar.

The requests of node commands (``AgentRequest``, ``FollowRequest``...) are frozen dataclasses; their
``to_json`` is what the supervisor sends, ``from_json`` what the node reads, checking every field's type
and refusing a key it does not know (a misspelt key is an error, never a silent default).
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import time
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

OUTPUT_MARK, FRAME_MARK, LIVE_MARK = "|", "@", "~"
FRAME_LIMIT = 4 * 2**20  # a frame's JSON past this is not one an agent wrote: unparsable
TEXT_LIMIT = 1 * 2**20  # output text past this is cut (the agent cuts rank lines at 64 KiB already)
_TIME_CHARS = 24  # a clock reading longer than this is not one


class FrameKind(str, Enum):
    """What a framed line is. OUTPUT is a line of output; every other kind is a frame of the agent (or ``follow``)."""

    OUTPUT = "output"  # ``|...``: a rank's line or the agent's own note
    LEASED = "leased"  # the agent holds its node's leases: {"kind", "devices", "host"} (not journaled)
    BUSY = "busy"  # the leases are held by others: the survey of the host (not journaled); the agent exits
    STARTED = "started"  # the command started: {"pid", "child", "host", "run_dir", "start_ticks", "devices"?}
    SAMPLE = "sample"  # each rank's process tree: {"t", "ranks": [...], "joined"?}
    NCCL = "nccl"  # the transport NCCL chose on the node: {"kind", "devices", "gdr", "version", "channels"}
    UNATTENDED = "unattended"  # no reader in contact for unattended_s: {"after_s"}; the agent ends the job
    ERROR_FILE = "error_file"  # torchrun's error file at the command's exit (``torchelastic``): {"message", "exit_code"}
    EXIT = "exit"  # the command's exit, its output drained: {"code", "error"?}; the last line of a journal
    FENCED = "fenced"  # a newer supervisor generation took the job: its record (to this reader only, not journaled)
    LOST = "lost"  # ``follow``: the agent is gone without an exit, or no journal: {"reason"}
    JOURNAL = "journal"  # the journal stopped keeping lines: {"state": "full", "limit"} or {"state": "unwritable", "error"}
    LEASE = "lease"  # a held lease's lock file was removed or replaced: ``leases.Moved.as_json``


_KINDS = {kind.value: kind for kind in FrameKind if kind is not FrameKind.OUTPUT}
DROPPABLE = (FrameKind.OUTPUT, FrameKind.SAMPLE)  # past a journal's bound these are not kept; every other line is


@dataclass(frozen=True)
class NodeTime:
    """A reading of a node's clocks: ``mono`` (monotonic: durations on that node) and ``wall`` (display only)."""

    mono: float
    wall: float


def now() -> NodeTime:
    return NodeTime(time.monotonic(), time.time())


def _stamp(at: NodeTime | None) -> bytes:
    at = at or now()
    return f"{at.mono:.3f} {at.wall:.3f}".encode()


def output_prefix(at: NodeTime | None = None) -> bytes:
    """What goes before the text of an output line stamped ``at`` (now): the relay stamps a read's lines at once."""
    return OUTPUT_MARK.encode() + _stamp(at) + b" "


def encode_output(text: str | bytes, at: NodeTime | None = None) -> bytes:
    """An output line (no newline): ``text`` (a line: no newline in it) stamped ``at`` (now)."""
    return output_prefix(at) + (text.encode() if isinstance(text, str) else text)


def encode_frame(kind: FrameKind, data: dict, at: NodeTime | None = None) -> bytes:
    """A frame of ``kind`` (not OUTPUT) carrying ``data`` (a JSON object), stamped ``at`` (now); no newline."""
    if kind is FrameKind.OUTPUT:
        raise ValueError("output is encoded by encode_output")
    return b"@" + kind.value.encode() + b" " + _stamp(at) + b" " + json.dumps(data, separators=(",", ":")).encode()


@dataclass(frozen=True)
class OutputLine:
    """A line of output; ``at`` None when it came unframed (not through an agent) or its stamp is unreadable."""

    text: str
    at: NodeTime | None = None
    kind: FrameKind = FrameKind.OUTPUT
    journaled: bool = True  # False: sent live only (``~``), not a line of the node's journal


@dataclass(frozen=True)
class Frame:
    """A frame of the agent (or ``follow``): its kind, its JSON object, the node's time when it was written."""

    kind: FrameKind
    data: dict
    at: NodeTime | None = None
    journaled: bool = True  # False: sent live only (``~``), not a line of the node's journal

    def get_int(self, key: str) -> int | None:
        """``data[key]`` when it is an int (not a bool), else None: frames are read, never trusted."""
        value = self.data.get(key)
        return value if type(value) is int else None

    def get_number(self, key: str) -> float | None:
        value = self.data.get(key)
        return float(value) if isinstance(value, (int, float)) and type(value) is not bool and math.isfinite(value) else None

    def get_text(self, key: str, limit: int = 1000) -> str | None:
        value = self.data.get(key)
        return value[:limit] if isinstance(value, str) else None


@dataclass(frozen=True)
class Unparsable:
    """A line that starts like a frame but is not one (an unknown kind, bad JSON, too long): ``why``."""

    line: str
    why: str
    journaled: bool = True


Parsed = OutputLine | Frame | Unparsable


def _time(token: str) -> float | None:
    if not token or len(token) > _TIME_CHARS or not token[0].isdigit():
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _stamped(rest: str) -> tuple[NodeTime | None, str]:
    """(the node time at the start of ``rest``, what follows it), or (None, ``rest``) without a readable stamp."""
    mono, _, after = rest.partition(" ")
    wall, _, tail = after.partition(" ")
    first, second = _time(mono), _time(wall)
    if first is None or second is None:
        return None, rest
    return NodeTime(first, second), tail


def live(line: bytes) -> bytes:
    """A framed line (no newline) marked as sent live only: not in the journal, so not counted by readers."""
    return LIVE_MARK.encode() + line


def parse(line: str | bytes) -> Parsed:
    """A framed line (no newline) read: output, a frame, or unparsable. Never raises; bounded work."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if line.startswith(LIVE_MARK) and line[1:2] in (OUTPUT_MARK, FRAME_MARK):
        return dataclasses.replace(parse(line[1:]), journaled=False)
    if line.startswith(OUTPUT_MARK):
        at, text = _stamped(line[1:])
        return OutputLine(text[:TEXT_LIMIT], at)
    if not line.startswith(FRAME_MARK):
        return OutputLine(line[:TEXT_LIMIT])
    name, _, rest = line[1:].partition(" ")
    kind = _KINDS.get(name)
    shown = line[:200]
    if kind is None:
        return Unparsable(shown, f"unknown frame kind {name[:40]!r}")
    at, body = _stamped(rest)
    if len(body) > FRAME_LIMIT:
        return Unparsable(shown, f"a {name} frame of {len(body)} characters (at most {FRAME_LIMIT})")
    try:
        data = json.loads(body) if body.strip() else {}
    except (ValueError, RecursionError) as exc:
        return Unparsable(shown, f"a {name} frame with unreadable JSON: {exc}"[:300])
    if not isinstance(data, dict):
        return Unparsable(shown, f"a {name} frame whose JSON is not an object")
    return Frame(kind, data, at)


def frame_mark(kind: FrameKind) -> bytes:
    """How every frame of ``kind`` starts (``@exit``): a quick look in a block of lines before ``kind_of``."""
    return FRAME_MARK.encode() + kind.value.encode()


def kind_of(line: bytes) -> FrameKind | None:
    """The kind of a framed line without reading its data (the journal's bound, ``follow``'s end); None: unframed
    or an unknown kind."""
    if line.startswith(b"|"):
        return FrameKind.OUTPUT
    if not line.startswith(b"@"):
        return None
    return _KINDS.get(line[1:line.find(b" ") if b" " in line else len(line)].decode("ascii", "replace"))


def early_output(lines: typing.Iterable[str], last: int | None = None, limit: int = 500) -> str:
    """The output among an agent's first lines, for an error that says why it did not start: the text of the
    ``last`` ones (all: None) joined with `` | ``, the end kept under ``limit`` characters; '' when there was none."""
    texts = [parsed.text for parsed in map(parse, lines) if isinstance(parsed, OutputLine)]
    return " | ".join(texts[-last:] if last else texts)[-limit:]


# requests: typed both ways, checked on the node


class RequestError(ValueError):
    """A node command's request is not one this node side reads (a wrong type, a missing or an unknown key)."""


R = TypeVar("R", bound="Request")


class Request:
    """A node command's request: a frozen dataclass, sent as a JSON object of its fields (``json_key`` renames)."""

    def to_json(self) -> dict:
        assert dataclasses.is_dataclass(self)
        return {_json_key(f): _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls: type[R], data: object) -> R:
        """The request ``data`` (a JSON object, or its text) says; RequestError naming the key at fault."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise RequestError(f"{cls.__name__}: not JSON: {exc}") from None
        return _decode(cls, data, cls.__name__)


def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("json_key", f.name)


def _plain(value: object) -> object:
    if isinstance(value, Request):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _decode(cls: type[R], data: object, where: str) -> R:
    if not isinstance(data, dict):
        raise RequestError(f"{where}: a JSON object is wanted, not {type(data).__name__}")
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    fields = {_json_key(f): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        raise RequestError(f"{where}: unknown key {unknown[0]!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                           + f"; known: {', '.join(sorted(fields))}")
    given = {}
    for key, f in fields.items():
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RequestError(f"{where}: the key {key!r} is missing")
            continue
        given[f.name] = _value(hints[f.name], data[key], f"{where}.{key}")
    return cls(**given)


def _value(hint: Any, value: object, where: str) -> Any:
    """``value`` checked (and converted: lists to tuples, nested requests) as the annotation ``hint`` says."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [arg for arg in args if arg is not type(None)]
        errors = []
        for option in options:
            try:
                return _value(option, value, where)
            except RequestError as exc:
                errors.append(str(exc))
        raise RequestError(errors[0] if len(errors) == 1 else f"{where}: not any of {hint}")
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Request):
        return _decode(hint, value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise RequestError(f"{where}: a list is wanted, not {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], item, f"{where}[{n}]") for n, item in enumerate(value))
        if len(value) != len(args):
            raise RequestError(f"{where}: {len(args)} items are wanted, not {len(value)}")
        return tuple(_value(arg, item, f"{where}[{n}]") for n, (arg, item) in enumerate(zip(args, value)))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise RequestError(f"{where}: a JSON object is wanted, not {type(value).__name__}")
        if not args:
            return value
        return {_value(args[0], k, where): _value(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
    if hint is float:
        if not isinstance(value, (int, float)) or type(value) is bool:
            raise RequestError(f"{where}: a number is wanted, not {type(value).__name__}")
        return float(value)
    if hint in (int, str, bool):
        if type(value) is not hint:
            raise RequestError(f"{where}: {hint.__name__} is wanted, not {type(value).__name__}")
        return value
    raise RequestError(f"{where}: no reader for {hint}")  # a field of a type this module does not know


@dataclass(frozen=True)
class LeaseRequest(Request):
    """What an agent (or ``leases``/``wait``) leases on its host (``launcher.node.leases``; docs/LEASES.md): ``count``
    devices of ``kind`` (gpu, slot) among ``capacity``."""

    kind: str
    count: int
    capacity: int
    job: str = ""
    origin: str | None = field(default=None, metadata={"json_key": "from"})  # the submitting host
    allow_shared: bool = False
    dir: str | None = None  # another lease directory than the nodes' default (tests)
    go_on_stdin: bool = False  # the agent starts its command only once ``go`` comes on its stdin
    waited: bool = False  # the job's tickets were found first (``wait``): its agent does not look at the queue again
    max_steps: int | None = None  # the job's, kept in the holder record: others see its step of how many


@dataclass(frozen=True)
class AgentRequest(Request):
    """What the node agent needs to run one node of a job (``launcher.node.agent``)."""

    job_id: str
    node: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # with ${LAUNCH_RUN_DIR} replaced by the run directory
    cwd: str | None = None
    files: dict[str, tuple[str, str]] = field(default_factory=dict)  # env name -> (file name, text) in the run dir
    gpus: int = 0
    grace: float = 5.0
    secrets_on_stdin: bool = False  # the secrets come as a JSON object on the line after the request
    cleanup: tuple[tuple[str, ...], ...] = ()  # commands that end the job's containers
    env_prefix: str = ""  # before every env name the plan sets (a container runtime's passthrough)
    unattended_s: float | None = None  # no reader in contact this long: the agent ends the job (None: never)
    generation: int = 0  # the supervisor generation that sent it: a node that records a newer one starts nothing
    record: dict | None = None  # the job as recorded (plan, specs, attempt), kept as job.json for `attach --cluster`
    rendezvous_port: int | None = None  # node 0's: the agents that joined are counted in its samples
    lease: LeaseRequest | None = None
    warn_file: str | None = None  # a scheduler's time-limit warning appears as this file (Slurm)
    journal_limit: int | None = None  # bytes (None: the journal's default)
    line_limit: int = 64 * 1024  # a line of output is cut past this many bytes
    sample_s: float = 2.0  # how often the ranks are sampled
    step_hooks: dict[str, str] = field(default_factory=dict)  # file name -> source: the ranks' step hooks (pyhooks)


@dataclass(frozen=True)
class FollowRequest(Request):
    """``follow``: node ``node``'s journal after line ``after``, for a supervisor of ``generation``."""

    job_id: str
    node: int
    after: int = 0
    generation: int = 0


@dataclass(frozen=True)
class CleanRequest(Request):
    """``clean``: this user's run directories on the node (only ``job_id``'s, when given) in which no agent runs and
    nothing changed for ``older_than_s`` seconds, removed; ``dry_run``: only listed. With ``filed_by`` (a job
    store's id) and ``job_id``: that store has filed the job; its run directory goes once every store that followed
    the job on the node has (``launcher.node.follow.collect``)."""

    job_id: str | None = None
    older_than_s: float = 0.0
    dry_run: bool = False
    filed_by: str | None = None


@dataclass(frozen=True)
class FenceRequest(Request):
    """``fence``: node ``node``'s generation record; with a newer ``generation``, recorded first (``pid``, ``host``:
    who takes the job; ``store``: the id of its job store, recorded as following the job there)."""

    job_id: str
    node: int
    generation: int | None = None
    pid: int | None = None
    host: str | None = None
    store: str | None = None


@dataclass(frozen=True)
class RecordRequest(Request):
    """``record``: the job as its supervisor recorded it in the run directory."""

    job_id: str


@dataclass(frozen=True)
class SweepRequest(Request):
    """``list`` and ``end``: the job's processes on the node (``end``: ended, after its ``cleanup`` commands). With a
    ``generation`` (and ``node``), a node that records a newer one refuses (``{"fenced": record}``)."""

    job_id: str
    grace: float = 5.0
    cleanup: tuple[tuple[str, ...], ...] = ()
    node: int | None = None
    generation: int | None = None


@dataclass(frozen=True)
class SignalRequest(Request):
    """``signal``: ``signal`` to ``pid`` if it still has ``start_ticks`` (a reused PID is left alone); fenced as
    ``SweepRequest`` is."""

    pid: int
    signal: int
    start_ticks: int | None = None
    job_id: str | None = None
    node: int | None = None
    generation: int | None = None


@dataclass(frozen=True)
class StacksRequest(Request):
    """``stacks``: every rank's Python stack on the node (``run_dir``: where py-spy's output goes, else the job's)."""

    job_id: str
    node: int | None = None
    run_dir: str | None = None


@dataclass(frozen=True)
class SlurmRun(Request):
    """What the supervisor writes for a Slurm node once its facts passed (``node<N>.run.json``)."""

    agent: AgentRequest
    secrets: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerCheck(Request):
    """How a node checks the job's container (``facts.container_facts``): the runtime's probe, whether the image is
    present, the pull policy (always, missing, never) and its command, the facts command run in a container of the
    image, and the InfiniBand options put right after ``docker run``/``podman run`` on a node with HCAs."""

    probe: tuple[str, ...]
    present: tuple[str, ...]
    pull: str
    pull_argv: tuple[str, ...] | None
    inside: tuple[str, ...]
    ib_options: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PythonsSurvey(Request):
    """Which interpreters a node has (``pythons.survey``): ``paths`` asked first, with ``search`` the usual places."""

    paths: tuple[str, ...] = ()
    search: bool = True


@dataclass(frozen=True)
class FactsRequest(Request):
    """``facts``: what a node is asked before a job runs (``launcher.node.facts``). Its interpreter, memory and disk
    always; ``modules`` it must import, the ``workdir``, network ``ifaces`` that must exist; with ``resolve_self``
    whether its host name resolves, with ``gpus`` its GPUs and their processes, with ``master`` its route there; a
    ``port``: free, or listened on for ``listen_s`` (``expect`` peers), or reached at ``connect`` within ``wait_s``;
    its ``kernel_log``; torch's JIT ``build_locks`` (under ``extensions_dir``, None: torch's default); the job's
    ``container``; a ``pythons`` survey; its host's ``leases`` in the same probe. With ``agent_within_s`` the probe,
    once it has answered, waits that long for an agent request on stdin and becomes that agent (``main``): preflight's
    interpreter starts the job, one a node instead of two."""

    modules: tuple[str, ...] = ()
    workdir: str | None = None
    run_root: bool = False  # whether the root of this user's run directories can be used
    ifaces: tuple[str, ...] = ()
    resolve_self: bool = False
    gpus: bool = False
    master: str | None = None
    port: int | None = None
    listen_s: float = 0.0
    expect: int = 0
    connect: str | None = None
    wait_s: float = 5.0
    kernel_log: bool = False
    build_locks: bool = False
    extensions_dir: str | None = None
    container: ContainerCheck | None = None
    pythons: PythonsSurvey | None = None
    leases: LeaseRequest | None = None
    agent_within_s: float | None = None


@dataclass(frozen=True)
class SlurmRequest(Request):
    """``slurm``: a Slurm node's side of the job (``launcher.node.slurmnode``): the attempt's shared directory, each
    node's facts request (by SLURM_NODEID), node 0's rendezvous port, how long to wait for its ``SlurmRun``."""

    dir: str
    facts: tuple[FactsRequest, ...]
    port: int | None = None
    wait_s: float = 600.0
