"""The metric record model: what a rank may report, what is refused and why, what is read back from a store."""

from __future__ import annotations

import json

import pytest

from launcher.metrics.record import (
    MARKER,
    MAX_RECORD_CHARS,
    MetricRecord,
    ProcessSample,
    RankUsage,
    Rejected,
    RejectedCount,
    parse_line,
    parse_samples,
)


def _line(**fields) -> str:
    return MARKER + json.dumps({"v": 1, "rank": 0, "step": 1, **fields})


def _parse(text: str, world_size: int = 4, stream: str = "[0]: "):
    """``text`` as it reaches the supervisor: on rank 0's stream, behind the prefix torchrun and the node side put."""
    return parse_line(stream + text, world_size=world_size, node=2, host="node-2")


def test_ordinary_output_is_not_a_record():
    assert _parse("step 10 loss 0.5") is None
    assert _parse("") is None
    assert _parse("@@launc {}") is None
    assert _parse("step 10", stream="") is None, "a launcher's own output"


def test_only_a_whole_line_is_a_record_a_print_that_contains_the_marker_is_output():
    assert _parse("debug: sending " + _line(step=3, samples=8, interval_s=0.5)) is None
    assert _parse(" " + _line(step=3)) is None
    assert _parse("[1]: " + _line(step=3)) is None, "a prefix the rank printed itself is its text, not its stream"
    record = _parse(_line(step=3, samples=8, interval_s=0.5))
    assert isinstance(record, MetricRecord) and record.step == 3 and record.samples == 8


def test_the_rank_is_the_stream_the_line_came_on_never_the_json():
    assert _parse(_line(rank=3, step=4), stream="[3]: ").rank == 3
    assert _parse(MARKER + '{"v":1,"step":4}', stream="[2]: ").rank == 2, "the JSON need not say it"
    assert parse_line(_line(rank=1, step=4), world_size=4, node=0, host="h", rank=1).rank == 1, "a caller that reads one rank's stream"
    forged = _parse(_line(rank=0, step=4), stream="[1]: ")
    assert isinstance(forged, Rejected) and forged.reason == "a record claiming rank 0 on the stream of rank 1"
    assert isinstance(_parse(_line(rank=True, step=4), stream="[1]: "), Rejected)
    nowhere = _parse(_line(step=4), stream="")
    assert isinstance(nowhere, Rejected) and "no rank's stream" in nowhere.reason
    outside = _parse(_line(rank=4, step=4), stream="[4]: ")
    assert isinstance(outside, Rejected) and "rank 4, which is not in this job (world size 4)" in outside.reason


def test_node_host_and_job_come_from_the_channel_never_from_the_line():
    record = _parse(_line(node=3, host="[/x] not me", job="another-job"))
    assert (record.node, record.host, record.job) == (2, "node-2", "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # the lines of the audit (issue 12)
        (MARKER + '{"v":1,"rank":0,"step":1,"samples":"x","interval_s":1}', "'samples': Input should be a valid integer"),
        (MARKER + '{"v":1,"rank":"x","step":1}', "a record claiming rank 'x' on the stream of rank 0"),
        (MARKER + '{"v":1,"rank":0,"step":9223372036854775808}', "'step': must be at most 1e+15"),
        (MARKER + '{"v":1,"rank":0,"step":1,"loss":NaN}', "'loss': Input should be a finite number"),
        (MARKER + '{"v":1,"rank":0,"step":1,"samples_per_sec":Infinity}', "'samples_per_sec': Input should be a finite number"),
        (MARKER + '{"v":1,"rank":0,"step":1,"step_time_s":-Infinity}', "'step_time_s': Input should be a finite number"),
        # bounds and shapes
        (_line(rank=4), "a record claiming rank 4 on the stream of rank 0"),
        (_line(rank=-1), "a record claiming rank -1 on the stream of rank 0"),
        (_line(step=-5), "'step': must be at least 0"),
        (_line(gpu_util=95), "'gpu_util': must be at most 1"),
        (_line(gpu_name="x" * 300), "'gpu_name': String should have at most 256 characters"),
        (_line(warmup="maybe"), "'warmup': Input should be a valid boolean"),
        (MARKER + '{"v":1,"rank":0}', "'step' is missing"),
        (MARKER + '{"v":2,"rank":0,"step":1}', "record version 2; this launch reads version 1"),
        (MARKER + '{"rank":0,"step":1}', "record version None"),
        (MARKER + "[1, 2]", "not a JSON object (list)"),
        (MARKER + "{not json", "not JSON"),
        (MARKER + "[" * 5000, "not JSON"),
        # program-added keys: flat values only, few of them, short names
        (_line(extra={"a": 1}), "'extra': a program-added value must be"),
        (_line(ok=[1, 2]), "'ok': a program-added value must be"),
        (_line(big=1e200), "'big': a program-added value must be"),
        (_line(**{"bad key": 1}), "key 'bad key': names are letters, digits and _"),
        (_line(**{f"k{i}": i for i in range(17)}), "more than 16 program-added keys"),
        (_line(note="y" * 300), "'note': a program-added value must be"),
    ],
)
def test_invalid_records_are_rejected_with_a_one_line_reason(text, reason):
    result = _parse(text)
    assert isinstance(result, Rejected), result
    assert reason in result.reason and "\n" not in result.reason


def test_a_huge_line_is_refused_by_its_length_without_parsing(monkeypatch):
    import pydantic_core

    def parse(*args, **kwargs):
        raise AssertionError("a 10 MB line reached the JSON parser")

    monkeypatch.setattr(pydantic_core, "from_json", parse)
    monkeypatch.setattr(json, "loads", parse)
    text = MARKER + '{"v":1,"rank":0,"step":1,"pad":"' + "x" * (10 * 2**20) + '"}'
    result = _parse(text)
    assert isinstance(result, Rejected) and f"(limit {MAX_RECORD_CHARS})" in result.reason


def test_valid_values_are_kept_with_their_types():
    record = _parse(_line(step=12, t=1.7e9, steps=4, interval_s=2.0, step_time_s=0.5, samples=64, tokens=8192,
                          samples_per_sec=32.0, tokens_per_sec=4096.0, loss=-0.25, mem_peak_bytes=2**33, warmup=True,
                          gpu_util=0.75, flops_per_sample=1e12, gpu_name="NVIDIA H200", local_rank=0,
                          busbw=3.5, label="run-a", flag=False))
    assert record.tokens == 8192 and record.loss == -0.25 and record.warmup is True and record.mem_peak_bytes == 2**33
    assert record.extra == {"busbw": 3.5, "label": "run-a", "flag": False}
    assert record.number("busbw") == 3.5 and record.number("label") is None and record.number("samples") == 64


def test_only_the_first_rejection_is_shown_and_all_are_counted():
    count = RejectedCount()
    first = count.add(Rejected("'rank': bad"))
    assert first == "metric record dropped: 'rank': bad (later drops are counted, not shown)"
    assert count.add(Rejected("'step': bad")) is None
    assert (count.count, count.first) == (2, "'rank': bad")


def test_stored_rows_are_read_back_without_ever_raising():
    data = {"v": 1, "rank": 1, "step": 5, "samples": 8, "loss": float("nan"), "interval_s": float("inf"), "node": 0,
            "kept": 2, "nested": {"a": 1}, "bad key": 1, "huge": 1e300}
    record = MetricRecord.from_stored(data, attempt=3)
    assert (record.rank, record.step, record.attempt, record.node, record.samples) == (1, 5, 3, 0, 8)
    assert record.loss is None and record.interval_s == 0.0, "NaN and infinities stored by older launches read as unknown"
    assert record.extra == {"kept": 2}, "program-added keys that would not validate are left out"
    for junk in ({"samples": "x"}, {"rank": "x"}, {"host": 7}, {"warmup": 1}, {"gpu_util": 3.0}, {"step": 10**20}):
        assert MetricRecord.from_stored({"rank": 0, "step": 1, **junk}) is None, junk
    assert MetricRecord.from_stored({"rank": 0}) is None


def test_process_samples_of_the_node_agent():
    event = {"t": 1.7e9, "ranks": [
        {"rank": 0, "local_rank": 0, "pid": 100, "pids": [100, 101], "cpu_s": 12.5, "rss_bytes": 2**30,
         "rss_peak_bytes": 2**31, "gpu_mem_bytes": None, "gpu_util": None},
        {"rank": 1, "pid": 200, "cpu_s": 1.0, "rss_bytes": 10, "rss_peak_bytes": 10, "gpu_mem_bytes": 5, "gpu_util": 0.5,
         "node": 9, "host": "claimed"},
        {"rank": 7, "pid": 300, "cpu_s": 1.0, "rss_bytes": 1, "rss_peak_bytes": 1},
        {"rank": 0, "pid": 100, "cpu_s": float("nan"), "rss_bytes": 1, "rss_peak_bytes": 1},
        "junk",
    ]}
    first, second, outside, nan, junk = parse_samples(event, world_size=2, node=1, host="n1")
    assert first == ProcessSample(node=1, rank=0, host="n1", t=1.7e9, pid=100, cpu_s=12.5, rss_bytes=2**30,
                                  rss_peak_bytes=2**31)
    assert (second.node, second.host, second.gpu_util) == (1, "n1", 0.5)
    assert isinstance(outside, Rejected) and "rank 7 is not in this job" in outside.reason
    assert isinstance(nan, Rejected) and "'cpu_s'" in nan.reason
    assert isinstance(junk, Rejected)
    assert parse_samples("nope", world_size=1, node=0, host=None) == [Rejected("a sample event needs a list 'ranks'")]


def test_sampled_peak_memory_is_the_gpu_figure_on_gpu_nodes_else_rss():
    assert RankUsage(rank=0, rss_peak_bytes=10, gpu_mem_peak_bytes=None).peak_mem_bytes == 10
    assert RankUsage(rank=0, rss_peak_bytes=10, gpu_mem_peak_bytes=7).peak_mem_bytes == 7
