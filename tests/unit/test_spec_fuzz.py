"""Property: whatever a spec file or a --set holds, the loader returns a model or raises SpecError, nothing else.

Documents are arbitrary bytes, arbitrary text, and YAML built at random (nested
mappings, lists and scalars, anchors and aliases, tags, odd Unicode, huge and
non-finite numbers), both in flow style and dumped by PyYAML, with keys drawn
from the real spec keys so that values reach the validators. The number of examples
(LAUNCH_FUZZ_EXAMPLES, default 600 per loader) keeps this file under 20 s on a loaded 2-core machine.
"""

from __future__ import annotations

import os

import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from launcher.backends import cluster_models, load_cluster
from launcher.errors import SpecError
from launcher.spec import ClusterSpec, JobSpec
from launcher.spec.load import load_job, read_mapping

EXAMPLES = int(os.environ.get("LAUNCH_FUZZ_EXAMPLES", "600"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SPEC_KEYS = sorted(
    {*JobSpec.model_fields, *(key for model in cluster_models().models.values() for key in model.model_fields), "micro_batch", "global_batch", "nproc_per_node", "nodes", "host",
     "port", "address", "user", "jump_host", "stall_timeout", "known_hosts", "gpus", "slots", "<<", "LAUNCH_JOB_ID", "A"}
)
ODD_SCALARS = [
    "1e23", "1e309", "-1e309", ".inf", ".nan", "9" * 30, "0x7fffffffffffffffff", "2024-13-45", "2024-01-01",
    "yes", "off", "~", "=", "0b", "1_000", "12:30:00", '"a\\0b"', '"\\x01"', "bastion:abc", "u@h:99999",
    "-rf", "a" * 64 + ".example", "::1", "[::1]:22", "!!binary zz", "!!int abc", "!!float x", "!!bool maybe",
    "!!python/object/apply:os.system [true]", "!!timestamp 2024-01-01", "!foo bar", "!!set {a}", "!!omap [a: 1]",
    "'\u202e\u0000'", "\"\\ud800\"", "naïve ☃ 漢字", "*undefined",
]
TAGS = ["", "", "", "!!str ", "!!int ", "!!seq ", "!!map ", "!!python/tuple ", "!local ", "!!merge "]

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
plain_scalar = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80).map(str), st.floats().map(repr), st.sampled_from(ODD_SCALARS),
    text.map(lambda t: yaml.safe_dump(t, default_style='"').strip()),
)


@st.composite
def flow_yaml(draw, depth: int = 0) -> str:
    """One flow-style YAML node: scalar, list or mapping, perhaps anchored, tagged or an alias."""
    kind = draw(st.sampled_from(["scalar", "scalar", "alias", "list", "map"] if depth < 4 else ["scalar", "alias"]))
    anchor = draw(st.sampled_from(["", "", "&a ", "&b "]))
    tag = draw(st.sampled_from(TAGS))
    if kind == "scalar":
        return anchor + tag + draw(plain_scalar)
    if kind == "alias":
        return draw(st.sampled_from(["*a", "*b", "*c"]))
    if kind == "list":
        items = draw(st.lists(flow_yaml(depth + 1), max_size=4))
        return anchor + tag + "[" + ", ".join(items) + "]"
    keys = draw(st.lists(st.one_of(st.sampled_from(SPEC_KEYS), flow_yaml(depth + 1), text.map(repr)), max_size=5))
    pairs = [f"? {key}\n: {draw(flow_yaml(depth + 1))}" if "\n" in key else f"{key}: {draw(flow_yaml(depth + 1))}" for key in keys]
    return anchor + tag + "{" + ", ".join(pairs) + "}"


spec_like = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text, st.sampled_from(ODD_SCALARS)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(SPEC_KEYS), inner, max_size=6)),
    max_leaves=20,
)
GOOD_JOB = {"name": "fuzz", "entrypoint": ["python", "train.py"], "batch": {"micro_batch": 8}}
GOOD_CLUSTER = {"name": "fuzz", "backend": "ssh", "nodes": [{"host": "node-1"}, {"host": "10.0.0.2", "port": 2222}]}
# A valid job or cluster with some values replaced: these reach the field validators, and some load.
near_valid = st.tuples(st.sampled_from([GOOD_JOB, GOOD_CLUSTER]), st.dictionaries(st.sampled_from(SPEC_KEYS), spec_like, max_size=2))
documents = st.one_of(
    near_valid.map(lambda base_changes: yaml.safe_dump({**base_changes[0], **base_changes[1]}, allow_unicode=True).encode()),
    st.binary(max_size=200),
    text.map(str.encode),
    flow_yaml().map(str.encode),
    st.dictionaries(st.sampled_from(SPEC_KEYS), spec_like, max_size=8).map(
        lambda data: yaml.safe_dump(data, allow_unicode=True).encode()
    ),
)
# Values as a shell hands them over, lone surrogates included (argv bytes that were not UTF-8).
set_value = st.one_of(plain_scalar, st.text(max_size=10), st.binary(max_size=10).map(lambda b: b.decode("utf-8", "surrogateescape")))
overrides = st.lists(st.tuples(st.sampled_from([*SPEC_KEYS, "batch.micro_batch", "a..b", "", "env.X"]), set_value)
                     .map(lambda kv: f"{kv[0]}={kv[1]}"), max_size=3)


def _only_models_or_spec_errors(path, load, sets):
    try:
        model = load(path, sets)
    except SpecError as exc:
        assert str(exc).strip()
        event("refused: " + ("spec" if " in the " in str(exc) else "YAML or file"))
    else:
        assert isinstance(model, (JobSpec, ClusterSpec))
        event("loaded")


@FUZZ
@given(documents, overrides)
def test_job_loader_returns_a_model_or_a_spec_error(tmp_path_factory, document, sets):
    path = tmp_path_factory.mktemp("fuzz") / "job.yaml"
    path.write_bytes(document)
    _only_models_or_spec_errors(path, load_job, sets)


@FUZZ
@given(documents, overrides)
@example(document=b"{(: !!int }", sets=[])  # an empty !!int: PyYAML's int constructor raised IndexError
def test_cluster_loader_returns_a_model_or_a_spec_error(tmp_path_factory, document, sets):
    path = tmp_path_factory.mktemp("fuzz") / "cluster.yaml"
    path.write_bytes(document)
    _only_models_or_spec_errors(path, load_cluster, sets)
    try:
        assert isinstance(read_mapping(path), dict)
    except SpecError:
        pass
