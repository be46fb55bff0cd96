"""Read YAML specs into pydantic models, keeping line numbers for errors.

Every problem in a file is reported at once, each as
``jobs/x.yaml:12: batch.micro_batch: Input should be greater than or equal to 1``,
with a did-you-mean suggestion for unknown keys. ``--set key.path=value``
overrides are applied before validation and are named in errors as such; the
same key path given twice in ``--set`` is an error. The YAML itself is read
under the bounds of ``launcher.spec.safeyaml``.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from launcher.errors import SpecError
from launcher.spec.cluster import ClusterSpec
from launcher.spec.files import check_regular, expand_user
from launcher.spec.job import JobSpec
from launcher.spec.safeyaml import Document, YAMLSyntaxError, parse_document, parse_value, read_spec_text

M = TypeVar("M", bound=BaseModel)
Loc = tuple[Any, ...]


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Load and validate a job spec, applying ``--set`` overrides."""
    return load_spec(JobSpec, path, overrides)


def load_cluster(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ClusterSpec:
    """Load and validate a cluster spec."""
    return load_spec(ClusterSpec, path, overrides)


def load_spec(model: type[M], path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> M:
    """Load ``path`` as ``model``; every problem is reported in one SpecError."""
    document = read_document(path)
    data = document.data
    set_locs: dict[Loc, str] = {}
    for item in overrides:
        loc = apply_override(data, item)
        if loc in set_locs:
            raise SpecError(f"--set {item!r}: '{'.'.join(loc)}' is already set by --set {set_locs[loc]!r}; give it once")
        set_locs[loc] = item
    spec = validate(model, data, str(path), document.lines, set_locs)
    check_named_files(spec, str(path), document.lines, set_locs)
    return spec


MAX_NAMED_FILE_BYTES = 1 << 20  # a DeepSpeed config, an ssh key, known_hosts or ssh config: far less than this


def named_files(spec: BaseModel) -> list[tuple[Loc, str, bool]]:
    """(key path, path text, may be missing) of every file on this machine that ``spec`` names and launch reads."""
    if isinstance(spec, JobSpec):
        return [(("deepspeed", "config"), spec.deepspeed.config, False)] if spec.deepspeed.config else []
    if isinstance(spec, ClusterSpec) and spec.backend == "ssh":
        files = [(("ssh", "known_hosts"), spec.ssh.known_hosts, True), (("ssh", "config_file"), spec.ssh.config_file, True)]
        if spec.ssh.key_file:
            files.append((("ssh", "key_file"), spec.ssh.key_file, True))
        return files
    return []


def check_named_files(spec: BaseModel, source: str, lines: dict[Loc, int], set_locs: dict[Loc, str]) -> None:
    """Every file the spec names: ``~user`` known here, a regular file (not a FIFO or a device) of bounded size.

    Checked at load, before anything reads them: a FIFO would block for ever, ``/dev/zero`` would fill memory.
    """
    for loc, text, missing_ok in named_files(spec):
        field = ".".join(loc)
        where = next((f"--set {item}" for set_loc, item in set_locs.items() if loc[: len(set_loc)] == set_loc),
                     f"{source}:{_line_of(loc, lines)}")
        check_regular(expand_user(text, f"{where}: {field}"), f"{where}: {field}", MAX_NAMED_FILE_BYTES,
                      missing_ok=missing_ok)


def read_document(path: str | Path) -> Document:
    """A spec file's top-level mapping and line numbers, read under the bounds of ``safeyaml``."""
    path = Path(path)
    return parse_document(read_spec_text(path), str(path))


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A spec file's top-level mapping, unvalidated (to tell a job from a cluster); SpecError otherwise."""
    return read_document(path).data


def apply_override(data: dict[str, Any], item: str) -> Loc:
    """Apply one ``key.path=value`` override in place; the value is parsed as YAML (text if it is not YAML)."""
    try:
        item.encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes from a command line that were not UTF-8
        raise SpecError(f"--set {item!r}: not UTF-8 text (undecodable byte at character {exc.start + 1})") from None
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set resources.nproc_per_node=2")
    parts = key.strip().split(".")
    if not all(parts):
        raise SpecError(f"--set {item!r}: '{key.strip()}' has an empty part; keys are separated by single dots")
    try:
        value = parse_value(raw, f"--set {item}") if raw.strip() else ""
    except YAMLSyntaxError:
        value = raw
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if child is None:
            child = target[part] = {}
        if not isinstance(child, dict):
            raise SpecError(f"--set {item!r}: '{part}' is not a section, cannot set '{key}' inside it")
        target = child
    target[parts[-1]] = value
    return tuple(parts)


def validate(model: type[M], data: Any, source: str, lines: dict[Loc, int], set_locs: dict[Loc, str]) -> M:
    """Validate plain data as ``model``; turn every pydantic error into one SpecError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(model, dict(err), source, lines, set_locs) for err in exc.errors()]
    noun = "problem" if len(problems) == 1 else "problems"
    raise SpecError(f"{source}: {len(problems)} {noun} in the {_kind(model)} spec:\n" + "\n".join(problems))


def _kind(model: type[BaseModel]) -> str:
    return "job" if model is JobSpec else "cluster" if model is ClusterSpec else model.__name__


def _describe(model: type[BaseModel], err: dict[str, Any], source: str, lines: dict[Loc, int], set_locs: dict[Loc, str]) -> str:
    loc = tuple(part for part in err["loc"] if part != "[key]")
    field = ".".join(str(p) for p in loc) or "(top level)"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
        suggestion = _did_you_mean(model, loc)
        if suggestion:
            message += f"; did you mean '{suggestion}'?"
        else:
            known = _known_keys(model, loc[:-1])
            if known:
                message += f"; expected one of: {', '.join(known)}"
    elif err["type"] == "missing":
        message = "required field is missing"
    elif "input" in err and err["type"] not in ("model_type", "dict_type") and not isinstance(err["input"], dict):
        message += f" (got {_shown(err['input'])})"
    for set_loc, item in set_locs.items():
        if loc[: len(set_loc)] == set_loc:
            return f"  --set {item}: {field}: {message}"
    return f"  {source}:{_line_of(loc, lines)}: {field}: {message}"


def _shown(value: Any, limit: int = 80) -> str:
    """``repr`` of an offending value, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _line_of(loc: Loc, lines: dict[Loc, int]) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def _did_you_mean(model: type[BaseModel], loc: Loc) -> str | None:
    known = _known_keys(model, loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return close[0] if close else None


def _known_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the section of ``model`` at ``loc`` (list indexes skipped)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        current = _section_model(current.model_fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _section_model(annotation: Any) -> Any:
    """The BaseModel inside an annotation such as ``NodeSpec``, ``list[NodeSpec]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _section_model(arg)
            if found is not None:
                return found
    return None
