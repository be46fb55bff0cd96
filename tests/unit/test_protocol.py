"""The wire protocol between node agents and their readers (launcher/node/protocol.py): every frame kind written
and read back with the node's times, output that looks like a frame stays output, bad lines never raise, and a
request with a misspelt key or a wrong type is refused by name."""

from __future__ import annotations

import json

import pytest

from launcher.node.protocol import (
    FRAME_LIMIT,
    TEXT_LIMIT,
    AgentRequest,
    FenceRequest,
    Frame,
    FrameKind,
    LeaseRequest,
    NodeTime,
    OutputLine,
    RequestError,
    SignalRequest,
    SlurmRun,
    SweepRequest,
    Unparsable,
    early_output,
    encode_frame,
    encode_output,
    kind_of,
    now,
    parse,
)

AT = NodeTime(12345.678, 1764800000.125)


@pytest.mark.parametrize("kind", [kind for kind in FrameKind if kind is not FrameKind.OUTPUT])
def test_every_frame_kind_reads_back_with_its_data_and_the_nodes_times(kind: FrameKind) -> None:
    data = {"code": 3, "reason": "x y", "nested": {"a": [1, 2]}}
    line = encode_frame(kind, data, AT)
    assert b"\n" not in line and kind_of(line) is kind
    assert parse(line) == Frame(kind, data, AT) == parse(line.decode())


def test_output_reads_back_with_its_text_and_times_and_is_stamped_now_by_default() -> None:
    assert parse(encode_output("[3]:loss 0.25 | @exit {}", AT)) == OutputLine("[3]:loss 0.25 | @exit {}", AT)
    assert parse(encode_output(b"", AT)) == OutputLine("", AT)
    before = now()
    parsed = parse(encode_output("hello"))
    assert isinstance(parsed, OutputLine) and parsed.at is not None
    assert before.mono <= parsed.at.mono + 0.001 and abs(parsed.at.wall - before.wall) < 5


@pytest.mark.parametrize("text", ['@exit {"code": 0}', "@fenced {}", "@started 1.0 2.0 {\"pid\": 1}", "|x", ""])
def test_a_ranks_line_that_looks_like_a_frame_stays_output(text: str) -> None:
    line = encode_output(text, AT)
    assert kind_of(line) is FrameKind.OUTPUT
    assert parse(line) == OutputLine(text, AT)


@pytest.mark.parametrize("line", [
    "@exitt 1.0 2.0 {}", "@ {}", "@", "@exit 1.0 2.0 {not json", "@exit 1.0 2.0 [1, 2]", "@exit 1.0 2.0 \"text\"",
    "@sample 1 2 " + "[" * 100_000, "@exit 1.0 2.0 {\"a\": 1} trailing",
])
def test_a_bad_frame_is_unparsable_never_an_exception(line: str) -> None:
    parsed = parse(line)
    assert isinstance(parsed, Unparsable) and parsed.why and len(parsed.line) <= 200


def test_unframed_and_unstamped_lines_are_output_without_node_times() -> None:
    assert parse("Traceback (most recent call last):") == OutputLine("Traceback (most recent call last):")
    assert parse("|no stamp here") == OutputLine("no stamp here")
    assert parse("|nan inf text") == OutputLine("nan inf text")
    assert parse(b"|\xff\xfe 1") == OutputLine("\ufffd\ufffd 1")
    assert parse('@exit {"code": 2}') == Frame(FrameKind.EXIT, {"code": 2})  # a frame without times still reads


def test_sizes_are_bounded() -> None:
    assert parse(encode_output("x" * (TEXT_LIMIT + 10), AT)) == OutputLine("x" * TEXT_LIMIT, AT)
    huge = encode_frame(FrameKind.SAMPLE, {"x": "y" * FRAME_LIMIT}, AT)
    assert isinstance(parse(huge), Unparsable)


def test_frame_fields_are_read_typed_never_trusted() -> None:
    frame = Frame(FrameKind.STARTED, {"pid": 7, "flag": True, "host": "h" * 3000, "n": 1.5, "bad": float("nan")})
    assert frame.get_int("pid") == 7 and frame.get_int("flag") is None and frame.get_int("host") is None
    assert frame.get_text("host") == "h" * 1000 and frame.get_text("pid") is None
    assert frame.get_number("n") == 1.5 and frame.get_number("pid") == 7.0 and frame.get_number("bad") is None


def test_output_is_not_encoded_as_a_frame() -> None:
    with pytest.raises(ValueError):
        encode_frame(FrameKind.OUTPUT, {})


def test_early_output_joins_the_output_among_an_agents_first_lines() -> None:
    lines = [encode_output(f"line {i}", AT).decode() for i in range(8)] + [encode_frame(FrameKind.EXIT, {"code": 1}).decode()]
    assert early_output(lines, last=2) == "line 6 | line 7"
    assert early_output(lines, limit=10) == "6 | line 7"
    assert early_output([encode_frame(FrameKind.EXIT, {"code": 1}).decode()]) == ""


def _agent() -> AgentRequest:
    return AgentRequest(job_id="j-1", node=2, argv=("python", "-c", "pass"), env={"A": "b"}, files={"F": ("f.json", "{}")},
                        cleanup=(("podman", "rm", "x"),), unattended_s=30.0, record={"plan": {"x": 1}},
                        lease=LeaseRequest(kind="gpu", count=2, capacity=8, job="j-1", origin="login",
                                           go_on_stdin=True, waited=True))


def test_an_agent_request_travels_as_json_and_reads_back_equal() -> None:
    request = _agent()
    sent = json.loads(json.dumps(request.to_json()))
    assert sent["lease"]["from"] == "login" and "origin" not in sent["lease"]
    assert AgentRequest.from_json(sent) == request
    assert AgentRequest.from_json(json.dumps(sent)) == request
    assert SlurmRun.from_json({"agent": sent, "secrets": {"TOKEN": "t"}}) == SlurmRun(request, {"TOKEN": "t"})


@pytest.mark.parametrize(("change", "said"), [
    ({"nod": 2}, "unknown key 'nod' (did you mean 'node'?)"),
    ({"run_root": "/tmp/x"}, "unknown key 'run_root'"),
    ({"node": "2"}, "AgentRequest.node: int is wanted, not str"),
    ({"node": True}, "AgentRequest.node: int is wanted, not bool"),
    ({"argv": "python"}, "AgentRequest.argv: a list is wanted, not str"),
    ({"env": {"A": 1}}, "AgentRequest.env['A']: str is wanted, not int"),
    ({"files": {"F": ["only one"]}}, "AgentRequest.files['F']: 2 items are wanted, not 1"),
    ({"lease": {"kind": "gpu", "count": 1, "capacity": 1, "go_on_stdn": True}},
     "AgentRequest.lease: unknown key 'go_on_stdn' (did you mean 'go_on_stdin'?)"),
    ({"grace": "5"}, "AgentRequest.grace: a number is wanted, not str"),
])
def test_a_misspelt_key_or_a_wrong_type_is_refused_by_name(change: dict, said: str) -> None:
    sent = {**_agent().to_json(), **change}
    if "nod" in change:
        del sent["node"]
    with pytest.raises(RequestError) as caught:
        AgentRequest.from_json(sent)
    assert said in str(caught.value)


def test_a_missing_key_or_not_an_object_is_refused() -> None:
    with pytest.raises(RequestError, match="the key 'argv' is missing"):
        AgentRequest.from_json({"job_id": "j", "node": 0})
    with pytest.raises(RequestError, match="a JSON object is wanted, not list"):
        AgentRequest.from_json("[1]")
    with pytest.raises(RequestError, match="not JSON"):
        AgentRequest.from_json("{")


def test_the_other_node_requests_read_back_and_keep_their_optional_fields() -> None:
    for request in (FenceRequest("j", 0, 3, 42, "login"), FenceRequest("j", 1), SweepRequest("j", 2.0, (("a", "b"),)),
                    SignalRequest(pid=5, signal=15, start_ticks=None, job_id="j", node=0, generation=1)):
        assert type(request).from_json(json.loads(json.dumps(request.to_json()))) == request
    assert SweepRequest.from_json({"job_id": "j", "grace": 1}).generation is None  # `launch cancel`: never fenced


def test_a_facts_request_with_a_misspelt_key_is_refused_by_the_node_not_answered_without_it() -> None:
    """The facts probe reads a typed request: a key it does not know (``kernel_logs``) is an error naming the one
    meant, where a dict read with ``get`` answered as if nothing had been asked."""
    import subprocess
    import sys

    from launcher.node.protocol import FactsRequest
    from launcher.node.ship import node_argv

    done = subprocess.run(node_argv(sys.executable, "facts", {"kernel_logs": True}), capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert "unknown key 'kernel_logs' (did you mean 'kernel_log'?)" in done.stderr
    assert FactsRequest.from_json(FactsRequest(kernel_log=True, ifaces=("ib0",)).to_json()) == FactsRequest(
        kernel_log=True, ifaces=("ib0",))
