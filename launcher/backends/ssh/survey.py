"""What `launch init` learns about SSH hosts: their keys, their GPUs, interpreters, network, CPUs, memory.

The hosts are reached through the ``ssh`` backend of a throwaway cluster spec (one connection per
host); their keys go through ``launch trust``'s functions; everything a host says about itself
comes from the node side's ``facts`` command (``pythons`` lists its candidate interpreters).
``choose_python`` picks the interpreter the cluster file names and ``differences`` lists what
differs between the hosts. Answers are parsed once into ``launcher.backends.facts.NodeFacts`` (typed,
bounded) where they arrive; a host whose answer does not parse is a problem of that host.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.backends.facts import FactsError, NodeFacts
from launcher.node.protocol import FactsRequest, PythonsSurvey

if TYPE_CHECKING:
    from launcher.backends.ssh.backend import SSHBackend

PROBE_TIMEOUT_S = 180.0
TEXT_LIMIT = 200


def _text(value: object) -> str | None:
    """A node's string, bounded and on one line (None stays None)."""
    if value is None:
        return None
    return " ".join(str(value).split())[:TEXT_LIMIT]


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: float

    @property
    def memory_gib(self) -> float:
        return round(self.memory_mib / 1024, 1)


@dataclass(frozen=True)
class Interpreter:
    """One candidate interpreter on a host, as it answered."""

    path: str
    version: str | None
    torch: str | None = None
    deepspeed: str | None = None
    imports_torch: bool | None = None  # None: not tried (no torch listed)
    import_error: str | None = None

    @property
    def has_torch(self) -> bool:
        return bool(self.torch) and self.imports_torch is not False

    @property
    def preference(self) -> tuple[bool, bool]:
        """Higher is better: torch that imports, then deepspeed beside it."""
        return self.has_torch, self.has_torch and bool(self.deepspeed)

    def describe(self) -> str:
        parts = [f"Python {self.version}"]
        if self.torch and not self.has_torch:
            parts.append(f"torch {self.torch} fails to import ({self.import_error})")
        else:
            parts.append(f"torch {self.torch}" if self.torch else "no torch")
        parts.append(f"deepspeed {self.deepspeed}" if self.deepspeed else "no deepspeed")
        return ", ".join(parts)


@dataclass(frozen=True)
class HostReport:
    """What one host said about itself."""

    host: str
    address: str
    hostname: str
    gpus: tuple[GPU, ...]
    interpreters: tuple[Interpreter, ...]
    interface: str | None
    route_error: str | None
    hcas: tuple[str, ...]
    cpus: int
    memory_bytes: int | None
    hostname_resolves: bool | str | None = None

    def interpreter(self, path: str | None) -> Interpreter | None:
        return next((i for i in self.interpreters if i.path == path), None)

    @property
    def best(self) -> Interpreter | None:
        """The most useful interpreter here (the first found among equals)."""
        return max(self.interpreters, key=lambda i: i.preference, default=None)

    @property
    def gpu_model(self) -> str:
        return ", ".join(sorted({g.name for g in self.gpus})) or "none"

    @classmethod
    def from_facts(cls, host: str, address: str, facts: NodeFacts | Mapping[str, object]) -> HostReport:
        """The report of a host's parsed facts (a raw answer is parsed first: FactsError if it does not)."""
        facts = facts if isinstance(facts, NodeFacts) else NodeFacts.parse(dict(facts))
        gpus = tuple(GPU(_text(g.name) or "?", g.total_mb) for g in facts.gpus)
        interpreters = tuple(
            Interpreter(_text(p.path) or "?", _text(p.version), _text(p.torch), _text(p.deepspeed),
                        p.imports_torch, _text(p.import_error))
            for p in facts.pythons if not p.error and p.version and p.path
        )
        resolves = facts.hostname_resolves
        return cls(
            host=host, address=address, hostname=_text(facts.hostname) or host, gpus=gpus,
            interpreters=interpreters, interface=_text(facts.dev), route_error=_text(facts.route_error),
            hcas=tuple(_text(h) or "" for h in facts.hcas), cpus=facts.cpus or 1,
            memory_bytes=facts.mem_total_bytes,
            hostname_resolves=resolves if resolves is True else _text(resolves),
        )


@dataclass(frozen=True)
class PythonChoice:
    """The interpreter the cluster file names, and what each host runs at that path (None: not there)."""

    path: str | None
    per_host: tuple[Interpreter | None, ...]

    @property
    def same_everywhere(self) -> bool:
        return self.path is not None and all(i is not None for i in self.per_host)


@dataclass(frozen=True)
class Difference:
    """One property whose value differs between hosts (values in host order)."""

    what: str
    values: tuple[str, ...]

    def describe(self, hosts: list[str]) -> str:
        return f"{self.what} differs: " + ", ".join(f"{h} {v}" for h, v in zip(hosts, self.values))


def choose_python(reports: list[HostReport]) -> PythonChoice:
    """The best path present on every host (judged on its worst host), unless only the first host has one
    that imports torch: then the first host's best (the file says the hosts differ)."""
    first = reports[0]
    best = first.best
    path = best.path if best else None
    common = [i.path for i in first.interpreters if all(r.interpreter(i.path) for r in reports)]
    if common:
        def worst(candidate: str) -> tuple[bool, bool]:
            return min(i.preference for r in reports if (i := r.interpreter(candidate)) is not None)

        shared = max(common, key=worst)
        if best is None or worst(shared)[0] >= best.has_torch:
            path = shared
    return PythonChoice(path, tuple(r.interpreter(path) for r in reports))


def differences(reports: list[HostReport], choice: PythonChoice) -> list[Difference]:
    """GPU model and count, and the chosen interpreter's Python, torch and deepspeed, where hosts differ."""
    def runs(index: int, field: str) -> str:
        interp = choice.per_host[index]
        return "(no interpreter)" if interp is None else (getattr(interp, field) or "none")

    columns = {
        "GPU model": [r.gpu_model for r in reports],
        "GPU count": [str(len(r.gpus)) for r in reports],
        "python version": [runs(i, "version") for i in range(len(reports))],
        "torch": [runs(i, "torch") for i in range(len(reports))],
        "deepspeed": [runs(i, "deepspeed") for i in range(len(reports))],
    }
    return [Difference(what, tuple(values)) for what, values in columns.items() if len(set(values)) > 1]


def trust_keys(backend: SSHBackend, confirm: Callable[[str], bool], echo: Callable[[str], None],
               recorded_to: list[str] | None = None) -> dict[str, str]:
    """Show every host's key; record new ones the user accepts (as `launch trust` does), each host recorded appended
    to ``recorded_to``. The problems, by host: unreachable, declined or a recorded key that differs (refused,
    never replaced here)."""
    from launcher.backends.ssh.connection import error_text, fan_out
    from launcher.backends.ssh.hostkeys import fingerprint, key_status
    from launcher.backends.ssh.trust import fetch_host_key, record_key

    settings = backend.pool.settings
    problems: dict[str, str] = {}
    for result in fan_out(lambda target: fetch_host_key(target, backend.pool), backend.targets, settings.fanout):
        target = result.key
        if not result.ok:
            problems[target.alias] = error_text(result.failure)
            continue
        key = result.got
        status, recorded = key_status(settings.host_keys(), target.known_hosts_name, key)
        if status == "trusted":
            continue
        echo(f"{target.label}  {key.get_name()}  {fingerprint(key)}")
        if status == "changed":
            was = f"{recorded.get_name()} {fingerprint(recorded)}" if recorded is not None else "another key"
            echo(f"  CHANGED: {settings.known_hosts} has {was}")
            problems[target.alias] = (f"{target.label}: the host key differs from the one recorded in "
                                      f"{settings.known_hosts}; not replaced (check it, then "
                                      f"`launch trust {target.alias} --replace`)")
        elif confirm(f"  trust this key for {target.known_hosts_name}?"):
            record_key(settings.known_hosts, target, key)
            echo(f"  recorded in {settings.known_hosts}")
            if recorded_to is not None:
                recorded_to.append(f"{target.alias} in {settings.known_hosts}")
        else:
            problems[target.alias] = f"{target.label}: host key not trusted (declined)"
    return problems


def probe(backend: SSHBackend, python: str | None,
          skip: Collection[str] = ()) -> tuple[list[HostReport], dict[str, str]]:
    """Connect to every host not in ``skip``, then ask each (in parallel) for its facts and interpreters:
    the reports of the hosts that answered and the problems of those that did not, by host. The route
    is checked towards the first host that answered. ``python`` pins the interpreter to check."""
    from launcher.backends.ssh.connection import error_text, fan_out

    indexes = [i for i, target in enumerate(backend.targets) if target.alias not in skip]
    connected = fan_out(lambda i: backend.pool.get(backend.targets[i]).peer_address(), indexes, backend.pool.settings.fanout)
    problems = {backend.targets[i].alias: error_text(r.failure) for i, r in zip(indexes, connected) if not r.ok}
    addresses = {i: r.got for i, r in zip(indexes, connected) if r.ok}
    if not addresses:
        return [], problems
    request = FactsRequest(gpus=True, resolve_self=True, master=next(iter(addresses.values())),
                           pythons=PythonsSurvey((python,), search=False) if python else PythonsSurvey((sys.executable,)))
    answers = fan_out(lambda i: backend.node_command(None, i, "facts", request, timeout=PROBE_TIMEOUT_S),
                      list(addresses), backend.pool.settings.fanout)
    reports = []
    for index, result in zip(addresses, answers):
        host = backend.targets[index].alias
        answer, error = result.got if result.ok else (None, error_text(result.failure))
        if answer is None:
            problems[host] = f"{host}: the probe failed (it needs python3 on the host's PATH): {error}"
            continue
        try:
            reports.append(HostReport.from_facts(host, addresses[index], NodeFacts.parse(answer)))
        except FactsError as exc:
            problems[host] = f"{host}: {exc}"
    return reports, problems


def unusable(problems: Collection[str], probed: int = 0, keys_recorded: Collection[str] = ()) -> str:
    """The message for hosts that cannot be used, one line each (``probed``: how many others were;
    ``keys_recorded``: the host keys recorded before, which stay)."""
    others = f" ({probed} other host(s) probed: see the table above)" if probed else ""
    written = (f"no cluster file was written (the host keys accepted stay recorded: {', '.join(keys_recorded)})"
               if keys_recorded else "nothing was written")
    return (f"{len(problems)} host(s) cannot be used; {written}{others}:\n"
            + "\n".join(f"  {p}" for p in problems))
