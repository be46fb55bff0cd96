"""Reading a spec's YAML as untrusted text: bounded, plain data only, every problem with its line.

A spec file is read up to ``MAX_SPEC_BYTES`` (one byte more tells it is too big, so
``/dev/zero`` ends at once) and must be UTF-8. libyaml parses it; launch's composer
counts every value as it is built, aliases included, so an alias bomb or a recursive
anchor is refused after at most ``MAX_VALUES`` values or ``MAX_EXPANDED_CHARS`` characters of
text (a few aliases of a long value expand to megabytes in few values), and nesting stops at
``MAX_DEPTH``. The result holds only mappings, lists, text, numbers, booleans and null:
tags other than those are refused (nothing is constructed from them), keys are read
as text, a key given twice in one mapping is an error naming both lines, and
timestamps stay text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, Event, ScalarEvent
from yaml.resolver import Resolver

from launcher.errors import SpecError
from launcher.spec.files import expand_user, read_regular

try:
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML built without libyaml: the pure-Python parser, same events
    from yaml.parser import Parser as _PyParser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, _PyParser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            _PyParser.__init__(self)


MAX_SPEC_BYTES = 1 << 20
MAX_VALUES = 100_000
MAX_DEPTH = 64
MAX_EXPANDED_CHARS = 4 << 20  # text once aliases are expanded: what a dry-run or the store would hold

Loc = tuple[Any, ...]
_N = TypeVar("_N", bound=yaml.Node)
_CORE = "tag:yaml.org,2002:"
SCALAR_TAGS = frozenset(_CORE + name for name in ("str", "int", "float", "bool", "null"))
MERGE = _CORE + "merge"


class YAMLSyntaxError(SpecError):
    """The text is not YAML at all (as opposed to YAML that a spec may not contain)."""


class _Refused(yaml.composer.ComposerError):
    """Valid YAML past a bound (size, depth) or with a recursive anchor."""

    def __init__(self, problem: str, mark: Any) -> None:  # yaml.error.Mark, or libyaml's own Mark
        super().__init__(None, None, problem, mark)


@dataclass(frozen=True)
class Document:
    """Plain data read from YAML and the 1-based line of every key path in it."""

    data: Any
    lines: dict[Loc, int]


def read_spec_text(path: Path) -> str:
    """The file's text: a regular file of at most MAX_SPEC_BYTES (checked before reading: a FIFO or
    ``/dev/zero`` is refused at once), UTF-8 (a BOM allowed), else SpecError."""
    raw = read_regular(expand_user(path, "spec file"), "spec file", MAX_SPEC_BYTES)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} cannot be decoded); a spec is a UTF-8 YAML file"
        ) from None


class _Resolver(Resolver):
    """YAML 1.1 resolution without timestamps and ``=``: such plain values stay text."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_CORE + "timestamp", _CORE + "value")]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }


@dataclass(frozen=True)
class _Extent:
    """A composed node once its aliases are expanded: values, characters of text, levels of nesting."""

    size: int
    chars: int
    levels: int


class _SpecLoader(Composer, _Parser, SafeConstructor, _Resolver):
    """libyaml's events composed by PyYAML's composer, which counts what it builds.

    What it learns of a node is kept by the node's id (the graph keeps every node alive while it is read):
    its extent, and whether it is a plain scalar whose tag YAML guessed (``guessed``)."""

    def __init__(self, text: str) -> None:
        _Parser.__init__(self, text)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        _Resolver.__init__(self)
        self.depth = 0
        self.built = 0
        self.extents: dict[int, _Extent] = {}
        self.guessed: set[int] = set()

    def _event(self) -> Event:
        event = self.peek_event()
        assert event is not None, "the composer asks for a node only before the document's end"
        return event

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self._event()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(event, AliasEvent) and id(node) not in self.extents:
            raise _Refused(f"alias *{event.anchor} is inside the value it names (a recursive anchor)", event.start_mark)
        return node

    def compose_scalar_node(self, anchor: Any) -> yaml.ScalarNode:
        self._count_built()
        event = self._event()
        node = super().compose_scalar_node(anchor)
        if isinstance(event, ScalarEvent) and event.tag in (None, "!") and event.implicit[0]:
            self.guessed.add(id(node))
        return self._counted(node, [], len(node.value))

    def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
        self._count_built()
        node = super().compose_sequence_node(anchor)
        return self._counted(node, node.value)

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        self._count_built()
        node = super().compose_mapping_node(anchor)
        return self._counted(node, [child for pair in node.value for child in pair])

    def _count_built(self) -> None:
        self.built += 1
        if self.built > MAX_VALUES:
            raise _Refused(f"more than {MAX_VALUES} values", self._event().start_mark)

    def _counted(self, node: _N, children: list[yaml.Node], chars: int = 0) -> _N:
        """Record the node's size, text and depth once expanded (aliases included); refuse past the bounds."""
        below = [self.extents[id(child)] for child in children]
        extent = self.extents[id(node)] = _Extent(
            size=1 + sum(child.size for child in below),
            chars=chars + sum(child.chars for child in below),
            levels=1 + max((child.levels for child in below), default=0),
        )
        if extent.size > MAX_VALUES:
            raise _Refused(f"expands to more than {MAX_VALUES} values through aliases", node.start_mark)
        if extent.chars > MAX_EXPANDED_CHARS:
            raise _Refused(f"expands to more than {MAX_EXPANDED_CHARS >> 20} Mi characters of text through aliases",
                           node.start_mark)
        if extent.levels > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels through aliases", node.start_mark)
        return node


@dataclass(frozen=True)
class _Composed:
    """A document's node graph and the ids of its plain scalars whose tag YAML guessed."""

    node: yaml.Node | None
    guessed: frozenset[int]


def compose(text: str, source: str) -> _Composed:
    """The document's node graph, sizes checked; YAMLSyntaxError or SpecError naming the line."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a --set from a command line that was not UTF-8
        raise SpecError(f"{source}: not UTF-8 text (undecodable byte at character {exc.start + 1})") from None
    loader = _SpecLoader(text)
    try:
        return _Composed(loader.get_single_node(), frozenset(loader.guessed))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = exc.problem or exc.context or "not valid YAML"
        if isinstance(exc, _Refused):
            raise SpecError(f"{where}: refused: {problem}") from None
        raise YAMLSyntaxError(f"{where}: not valid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text.encode("utf-8", "surrogatepass")[: exc.position].count(b"\n") + 1
        character = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise YAMLSyntaxError(
            f"{source}:{line}: not valid YAML: the control character {character} is not allowed in YAML text"
        ) from None
    except yaml.YAMLError as exc:
        raise YAMLSyntaxError(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def to_data(node: yaml.Node, guessed: frozenset[int], source: str) -> Document:
    """Plain data of a composed document (merges applied, nothing shared); SpecError listing every problem."""
    builder = _Builder(source, guessed)
    data = builder.build(node, ())
    if builder.problems:
        problems = sorted(builder.problems.items())
        noun = "problem" if len(problems) == 1 else "problems"
        listed = "\n".join(f"  {source}:{line}: {text}" for (line, text), _ in problems)
        raise SpecError(f"{source}: {len(problems)} YAML {noun}:\n{listed}")
    return Document(data, builder.lines)


def parse_document(text: str, source: str) -> Document:
    """Parse ``text`` (whose top level must be a mapping) into plain data and line numbers."""
    composed = compose(text, source)
    node = composed.node
    if node is None:
        raise SpecError(f"{source}: the file is empty; expected a mapping of spec keys")
    if not isinstance(node, yaml.MappingNode):
        raise SpecError(f"{source}:{node.start_mark.line + 1}: expected a mapping of spec keys at the top level")
    return to_data(node, composed.guessed, source)


def parse_value(text: str, source: str) -> Any:
    """One value (a ``--set`` right-hand side) under the same rules; None when it holds no value."""
    composed = compose(text, source)
    return None if composed.node is None else to_data(composed.node, composed.guessed, source).data


_LEGACY_OCTAL = re.compile(r"[-+]?0[0-9_]+")


def _octal(text: str) -> str:
    try:
        return str(int(text.replace("_", ""), 8))
    except ValueError:
        return "an error: it has the digit 8 or 9"


def _tag_name(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


class _Builder:
    """Walks a composed graph into fresh dicts and lists, collecting problems by line."""

    def __init__(self, source: str, guessed: frozenset[int]) -> None:
        self.source = source
        self.guessed = guessed
        self.lines: dict[Loc, int] = {}
        self.problems: dict[tuple[int, str], None] = {}
        self._scalars = SafeConstructor()

    def problem(self, node: yaml.Node, text: str) -> None:
        self.problems[(node.start_mark.line + 1, text)] = None

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self.lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode) and node.tag == _CORE + "map":
            return self._mapping(node, loc)
        if isinstance(node, yaml.SequenceNode) and node.tag == _CORE + "seq":
            return [self.build(item, loc + (index,)) for index, item in enumerate(node.value)]
        if isinstance(node, yaml.ScalarNode) and node.tag in SCALAR_TAGS:
            return self._scalar(node)
        self.problem(
            node,
            f"the tag {_tag_name(node.tag)} is not allowed: a spec holds plain values (text, numbers, true/false, lists, mappings)",
        )
        return None

    def _scalar(self, node: yaml.ScalarNode) -> Any:
        if node.tag in (_CORE + "int", _CORE + "float") and ":" in node.value:
            if id(node) in self.guessed:
                return node.value  # YAML 1.1's base 60 (1:30 = 90); YAML 1.2 reads it as text, so does launch
            self.problem(node, f"cannot read {node.value[:40]!r} as {_tag_name(node.tag)}: base-60 numbers "
                               "(YAML 1.1) are not read; write the number itself")
            return None
        if node.tag == _CORE + "int" and _LEGACY_OCTAL.fullmatch(node.value):
            self.problem(node, f"{node.value[:40]!r} has a leading zero: YAML 1.1 reads it as an octal number "
                               f"({_octal(node.value)}), YAML 1.2 as decimal; write the number without the leading "
                               "zero, or quote it for text")
            return None
        try:
            return self._scalars.construct_object(node)
        except (yaml.YAMLError, ValueError, TypeError, LookupError, ArithmeticError):  # an empty !!int: IndexError
            shown = repr(node.value) if len(node.value) <= 40 else f"{node.value[:37]!r}... ({len(node.value)} characters)"
            self.problem(node, f"cannot read {shown} as {_tag_name(node.tag)}")
            return None

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        data: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merged: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE:
                merged.append(value_node)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problem(key_node, "a key must be a single value such as 'name', not a list or mapping (a complex key)")
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in first_line:
                where = ".".join(str(p) for p in loc + (key,))
                self.problem(
                    key_node, f"{where}: the key '{key}' is given twice, on lines {first_line[key]} and {line}; keep one",
                )
                continue
            first_line[key] = line
            self.lines.setdefault(loc + (key,), line)
            data[key] = self.build(value_node, loc + (key,))
        for source in merged:
            sources = source.value if isinstance(source, yaml.SequenceNode) else [source]
            for mapping in sources:
                if not isinstance(mapping, yaml.MappingNode):
                    self.problem(mapping, "'<<' merges a mapping (or a list of mappings) into this one")
                    continue
                for key, value in self._mapping(mapping, loc).items():
                    data.setdefault(key, value)
        return data
