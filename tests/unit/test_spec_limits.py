"""Hostile or odd spec files: exit 2 with the file and line, never a traceback, never more than they should do."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

from launcher.backends import load_cluster
from launcher.cli.main import main
from launcher.errors import SpecError
from launcher.spec.load import load_job
from launcher.spec.safeyaml import MAX_SPEC_BYTES, MAX_VALUES
from tests.helpers import run_cli

JOB = "name: x\nentrypoint: [python, t.py]\nbatch: {micro_batch: 8}\n"
CLUSTER = "name: c\nbackend: ssh\n"


def validate(tmp_path, text: str | bytes, capsys, name: str = "spec.yaml") -> str:
    """`launch validate FILE` in this process: its stderr, after checking exit 2 and no traceback."""
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith("error ") and "Traceback" not in err
    return err


def accepted(tmp_path, text: str, capsys, name: str = "spec.yaml") -> None:
    path = tmp_path / name
    path.write_text(text)
    main(["validate", str(path)])
    assert f"ok    {path}" in capsys.readouterr().out


def alias_bomb(levels: int = 9) -> str:
    """About 400 bytes that a naive loader expands to 9**levels strings."""
    lines = [JOB.rstrip("\n"), 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    previous = "a"
    for name in "bcdefghijklm"[: levels - 1]:
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    return "\n".join(lines) + "\n"


# ---- every YAML or encoding problem: exit 2, file and line

YAML_CASES = [
    ("not UTF-8", JOB.encode() + b"seed: caf\xe9\n", ["spec.yaml:4", "not UTF-8"]),
    ("binary", b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe", ["spec.yaml:1", "not UTF-8"]),
    ("a NUL byte in the text", JOB.encode() + b"seed: 1\x00\n", ["spec.yaml:4", "U+0000"]),
    ("a recursive anchor", JOB + "env: &e {A: *e}\n", ["spec.yaml:4", "recursive anchor"]),
    ("a complex key", JOB + "? [a, b]\n: 1\n", ["spec.yaml:4", "complex key"]),
    ("a mapping as key", JOB + "env: {{A: 1}: x}\n", ["spec.yaml:4", "complex key"]),
    ("a set", JOB + "seed: !!set {a, b}\n", ["spec.yaml:4", "tag !!set is not allowed"]),
    ("a bad explicit int", JOB + "seed: !!int twelve\n", ["spec.yaml:4", "cannot read 'twelve' as !!int"]),
    ("a bad explicit bool", JOB + "leave_out_failed_nodes: !!bool maybe\n", ["spec.yaml:4", "as !!bool"]),
    ("an int too long to convert", JOB + "seed: " + "9" * 5000 + "\n", ["spec.yaml:4", "(5000 characters) as !!int"]),
    ("nesting", JOB + "x: " + "[" * 100 + "]" * 100 + "\n", ["spec.yaml:4", "nested deeper than 64 levels"]),
    ("two documents", JOB + "---\nname: y\n", ["spec.yaml:4", "not valid YAML"]),
    ("an undefined alias", JOB + "seed: *nowhere\n", ["spec.yaml:4", "undefined alias"]),
]


@pytest.mark.parametrize("description,text,fragments", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_yaml_and_encoding_problems_exit_2_with_file_and_line(description, text, fragments, tmp_path, capsys):
    err = validate(tmp_path, text, capsys)
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from:\n{err}"


def test_a_python_tag_is_refused_naming_its_line_and_never_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"
    text = JOB + f"seed: !!python/object/apply:os.system ['touch {marker}']\n"
    err = validate(tmp_path, text, capsys)
    assert "spec.yaml:4: the tag !!python/object/apply:os.system is not allowed" in err
    assert not marker.exists()


def test_keys_are_read_as_text(tmp_path, capsys):
    # YAML 1.1 would make `on` a boolean and `1` an int; a spec key is what the user typed.
    err = validate(tmp_path, JOB + "on: 1\nenv: {1: x}\n", capsys)
    assert "spec.yaml:4: on: unknown key" in err
    assert "spec.yaml:5: env.1: '1' is not an environment variable name" in err


def test_dates_and_odd_plain_values_stay_text(tmp_path, capsys):
    accepted(tmp_path, "name: 2024-13-45\nentrypoint: [python, t.py, 2024-01-01, =]\nbatch: {micro_batch: 8}\n", capsys)


# ---- duplicate keys: the file (any level) and --set

def test_a_key_given_twice_names_both_lines_at_any_level(tmp_path, capsys):
    text = JOB + "max_steps: 5\nresources:\n  nodes: 1\n  nodes: 2\nmax_steps: 7\n"
    err = validate(tmp_path, text, capsys)
    assert "spec.yaml:8: max_steps: the key 'max_steps' is given twice, on lines 4 and 8" in err
    assert "spec.yaml:7: resources.nodes: the key 'nodes' is given twice, on lines 6 and 7" in err


def test_the_same_set_given_twice_is_refused(tmp_path, home, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    with pytest.raises(SystemExit) as exit_info:
        main(["submit", str(job), "--dry-run", "--set", "max_steps=5", "--set", "max_steps=7"])
    assert exit_info.value.code == 2
    assert "--set 'max_steps=7': 'max_steps' is already set by --set 'max_steps=5'" in capsys.readouterr().err


def test_a_set_that_is_not_utf8_is_refused(tmp_path, home):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    for item, where in (("env.A=\udcff", "character 7"), ("env.\udcff=1", "character 5")):  # the byte 0xff on the command line
        result = run_cli(home, "submit", str(job), "--dry-run", "--set", item)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"not UTF-8 text (undecodable byte at {where})" in result.stderr


def test_yaml_merge_keys_still_work_and_explicit_keys_win(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nentrypoint: [python, t.py]\nbatch:\n  <<: {micro_batch: 4, grad_accum: 2}\n  micro_batch: 8\n")
    assert (load_job(path).batch.micro_batch, load_job(path).batch.grad_accum) == (8, 2)


# ---- input limits: size, alias expansion

def test_dev_zero_as_a_spec_ends_at_once_with_exit_2(tmp_path):
    tracemalloc.start()
    with pytest.raises(SpecError, match="spec file: /dev/zero is a character device, not a regular file"):
        load_job("/dev/zero")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * MAX_SPEC_BYTES  # refused before reading: /dev/zero read to the limit would be that much
    result = run_cli(tmp_path, "validate", "/dev/zero", timeout=60)
    assert result.returncode == 2 and "/dev/zero is a character device, not a regular file" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_over_the_cap_is_refused_and_one_under_it_is_read(tmp_path, capsys):
    padding = "#" * 1000 + "\n"
    err = validate(tmp_path, JOB + padding * (MAX_SPEC_BYTES // len(padding) + 1), capsys)
    assert "more than the 1 MiB it may" in err
    accepted(tmp_path, JOB + padding * (MAX_SPEC_BYTES // len(padding) - 1), capsys)


def test_an_alias_bomb_is_refused_at_once_with_little_memory(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert len(path.read_bytes()) < 500
    tracemalloc.start()
    with pytest.raises(SpecError, match=f"bomb.yaml:9: refused: expands to more than {MAX_VALUES} values through aliases"):
        load_job(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 5_000_000  # the expansion is counted, never built
    validate(tmp_path, alias_bomb(), capsys, name="bomb.yaml")


def test_aliases_within_the_budget_expand(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nentrypoint: &argv [python, t.py]\nbatch: {micro_batch: 8}\nenv: {A: &v value, B: *v}\n")
    assert load_job(path).env == {"A": "value", "B": "value"}


# ---- numbers bounded and finite, the bounds in the schema

NUMBER_CASES = [
    ("max_steps: 1.0e+23", "max_steps"),
    ("max_steps: 1000000000001", "less than or equal to 1000000000000"),
    ("seed: 18446744073709551616", "seed: Input should be less than or equal to 4294967295"),
    ("watch: {stall_timeout: 1e309}", "watch.stall_timeout: Input should be a finite number"),
    ("watch: {stall_timeout: .inf}", "watch.stall_timeout: Input should be a finite number"),
    ("watch: {stall_timeout: .nan}", "watch.stall_timeout: Input should be a finite number"),
    ("watch: {stall_timeout: 1.0e+7}", "watch.stall_timeout: Input should be less than or equal to 604800"),
    ("lr: .nan", "lr: Input should be a finite number"),
    ("resources: {nodes: 1000000000}", "resources.nodes: Input should be less than or equal to 4096"),
    ("resources: {nproc_per_node: 1025}", "resources.nproc_per_node: a number of processes from 1 to 1024, or 'auto'"),
    ("batch: {micro_batch: 8, global_batch: 100000000}", "batch.global_batch: Input should be less than or equal to"),
]


@pytest.mark.parametrize("line,fragment", NUMBER_CASES, ids=[c[0] for c in NUMBER_CASES])
def test_numbers_are_bounded_and_finite(line, fragment, tmp_path, capsys):
    text = JOB.replace("batch: {micro_batch: 8}\n", "") + line + "\n"
    if not line.startswith("batch"):
        text += "batch: {micro_batch: 8}\n"
    assert fragment in validate(tmp_path, text, capsys)


def test_cluster_numbers_are_bounded_and_finite(tmp_path, capsys):
    err = validate(tmp_path, CLUSTER + "ssh: {connect_timeout: .inf}\ngpu: {peak_tflops: 1e999}\nnodes:\n  - {host: a, gpus: 100000}\n", capsys)
    for fragment in ("ssh.connect_timeout: Input should be a finite number", "gpu.peak_tflops: Input should be a finite number",
                     "nodes.0.gpus: Input should be less than or equal to 1024"):
        assert fragment in err


def test_schema_shows_the_bounds(capsys):
    main(["schema", "job"])
    job = json.loads(capsys.readouterr().out)
    main(["schema", "cluster"])
    cluster = json.loads(capsys.readouterr().out)
    assert job["properties"]["max_steps"]["anyOf"][0]["maximum"] == 10**12
    assert job["$defs"]["ResourcesSpec"]["properties"]["nodes"]["maximum"] == 4096
    assert job["$defs"]["ResourcesSpec"]["properties"]["nproc_per_node"]["anyOf"][0]["maximum"] == 1024
    assert job["$defs"]["WatchSpec"]["properties"]["stall_timeout"]["maximum"] == 7 * 24 * 3600
    assert job["properties"]["secrets"]["items"]["pattern"] == "^[A-Za-z_][A-Za-z0-9_]*$"
    assert cluster["$defs"]["SSHCluster"]["properties"]["nodes"]["maxItems"] == 4096
    assert cluster["$defs"]["SlurmSpec"]["properties"]["time_warning"]["maximum"] == 65535


# ---- NUL and control characters; lengths

def test_nul_and_control_characters_are_refused_where_they_make_no_sense(tmp_path, capsys):
    err = validate(tmp_path, JOB.replace("[python, t.py]", '[python, "t\\0.py"]')
                   + 'env: {A: "a\\0b", B: "two\\nlines are fine"}\ndata: {path: "/data\\x1b[31m"}\n', capsys)
    assert "entrypoint.1: contains a NUL character" in err
    assert "env.A: contains a NUL character" in err and "env.B" not in err
    assert "data.path: contains the control character U+001B" in err
    err = validate(tmp_path, CLUSTER + 'workdir: "/w\\0"\nnodes:\n  - {host: "a\\tb", user: "r oot"}\n', capsys)
    assert "workdir: contains the control character U+0000" in err
    assert "nodes.0.host: 'a\\tb' is not a host name or address" in err
    assert "nodes.0.user: a user name cannot contain spaces" in err


def test_lengths_are_bounded(tmp_path, capsys):
    err = validate(tmp_path, JOB + f"env: {{{'A' * 300}: x}}\ndata: {{path: /{'p' * 5000}}}\n", capsys)
    assert "at most 255 characters" in err and "data.path: String should have at most 4096 characters" in err


# ---- reserved environment names

def test_launch_names_are_reserved_in_env_and_secrets(tmp_path, capsys):
    err = validate(tmp_path, JOB + "env:\n  LAUNCH_JOB_ID: other\n  TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: x\nsecrets: [LAUNCH_NODE]\n", capsys)
    assert "spec.yaml:5: env.LAUNCH_JOB_ID: LAUNCH_JOB_ID is reserved: launch sets LAUNCH_* names itself to tag" in err
    assert "spec.yaml:6: env.TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is reserved" in err
    assert "spec.yaml:7: secrets.0: LAUNCH_NODE is reserved" in err


def test_the_reporter_knobs_stay_settable(tmp_path, capsys):
    accepted(tmp_path, JOB + "env: {LAUNCH_METRICS: '0', LAUNCH_METRICS_EVERY: '5', launch_job_id: lowercase-is-not-ours}\n", capsys)


# ---- hosts: valid names, distinct nodes, jump hosts

@pytest.mark.parametrize("host", ["gpu-node-1", "dgx_01", "node.example.com.", "10.0.0.1", "fe80::1", "a" * 63])
def test_host_names_and_aliases_users_have_are_accepted(host, tmp_path, capsys):
    accepted(tmp_path, CLUSTER + f"nodes:\n  - {{host: '{host}'}}\n", capsys)


@pytest.mark.parametrize("host,fragment", [
    ("a" * 64 + ".example.com", "is 64 characters; each dot-separated part of a host name has 1-63"),
    ("-oProxyCommand=x", "not starting with '-'"),
    ("a..b", "is not a host name or address"),
    ("user@host", "is not a host name or address"),
    ("", "a host name cannot be empty"),
    ("fe80::1%eth0", "'fe80::1%eth0': an IPv6 zone id ('%' and an interface) is not accepted"),
    ("fe80::1%$(reboot)", "an IPv6 zone id ('%' and an interface) is not accepted"),
])
def test_invalid_host_names_are_refused_at_validation(host, fragment, tmp_path, capsys):
    assert fragment in validate(tmp_path, CLUSTER + f"nodes:\n  - {{host: '{host}'}}\n", capsys)


def test_a_node_listed_twice_is_refused_naming_both_entries(tmp_path, capsys):
    text = CLUSTER + "ssh: {port: 2222}\nnodes:\n  - {host: a}\n  - {host: b, address: 10.0.0.9}\n  - {host: A, port: 2222}\n" \
        "  - {host: c, address: 10.0.0.9}\n  - {host: a, port: 22}\n"
    err = validate(tmp_path, text, capsys)
    assert "spec.yaml:4: nodes: nodes 0 and 2 are the same node (host A port 2222)" in err
    assert "nodes 1 and 3 are the same node (address 10.0.0.9)" in err
    assert "4 and" not in err  # same host on another port is another sshd


@pytest.mark.parametrize("jump,fragment", [
    ("bastion:abc", "jump host 'bastion:abc': port 'abc' is not a number from 1 to 65535"),
    ("user@host:99999", "jump host 'user@host:99999': port '99999' is not a number from 1 to 65535"),
    ("a,,b", "a jump host cannot be empty (two commas, or a trailing one?)"),
    ("fe80::1:22", None),
    ("[fe80::1]x", "jump host '[fe80::1]x': '[...]' holds an IPv6 address"),
])
def test_jump_hosts_are_checked_at_validation(jump, fragment, tmp_path, capsys):
    text = CLUSTER + f"ssh: {{jump_host: '{jump}'}}\nnodes: [{{host: a}}]\n"
    if fragment is None:
        accepted(tmp_path, text, capsys)
    else:
        assert f"ssh.jump_host: {fragment}" in validate(tmp_path, text, capsys)


def test_validate_tells_a_cluster_from_a_job_through_the_same_bounded_reader(tmp_path, capsys):
    # yaml.safe_load raised ValueError on the date-like value (a traceback); the spec reader keeps it as text.
    accepted(tmp_path, CLUSTER + "nodes: [{host: a}]\nworkdir: 2024-13-45\n", capsys)
    assert load_cluster(tmp_path / "spec.yaml").workdir == "2024-13-45"
    err = validate(tmp_path, alias_bomb().replace("name: x\n", "name: x\nbackend: ssh\n"), capsys)
    assert "refused: expands to more than" in err


# ---- workdir

def test_an_empty_workdir_is_refused(tmp_path, capsys):
    assert "workdir: String should have at least 1 character" in validate(tmp_path, CLUSTER + "workdir: ''\nnodes: [{host: a}]\n", capsys)


# ---- issue 24: alias expansion bounded in characters, YAML 1.1 numbers, files a spec names

def test_a_few_aliases_of_a_long_value_are_refused_by_expanded_size(tmp_path, capsys):
    """142 KB of aliases of one long text once made a 132 MB dry-run: few values, many characters."""
    long = "x" * 100_000
    text = JOB + f"env:\n  A: &v {long}\n" + "".join(f"  B{i}: *v\n" for i in range(60))
    path = tmp_path / "wide.yaml"
    path.write_text(text)
    assert len(text) < 110_000
    with pytest.raises(SpecError, match="wide.yaml:5: refused: expands to more than 4 Mi characters of text through aliases"):
        load_job(path)
    validate(tmp_path, text, capsys, name="wide.yaml")


def test_aliases_of_a_long_value_within_the_budget_expand(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB + "env:\n  A: &v " + "y" * 1000 + "\n" + "".join(f"  B{i}: *v\n" for i in range(10)))
    assert load_job(path).env["B9"] == "y" * 1000


@pytest.mark.parametrize("line,fragment", [
    ("seed: 017", "spec.yaml:4: '017' has a leading zero: YAML 1.1 reads it as an octal number (15), YAML 1.2 as decimal"),
    ("max_steps: 0100", "'0100' has a leading zero"),
    ("seed: !!int 1:30", "spec.yaml:4: cannot read '1:30' as !!int: base-60 numbers (YAML 1.1) are not read"),
    ("max_steps: 1:30", "max_steps: Input should be a valid integer, unable to parse string as an integer (got '1:30')"),
])
def test_yaml_1_1_octal_and_base_60_numbers_are_not_read_as_numbers(line, fragment, tmp_path, capsys):
    assert fragment in validate(tmp_path, JOB + line + "\n", capsys)


def test_base_60_looking_text_stays_text_as_yaml_1_2_reads_it(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB + "env: {WINDOW: 1:30, TIME: 12:05:59}\n")
    assert load_job(path).env == {"WINDOW": "1:30", "TIME": "12:05:59"}


def job_with(tmp_path, extra: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(JOB + extra)
    return str(path)


@pytest.mark.parametrize("target,fragment", [
    ("/dev/zero", "job.yaml:4: deepspeed.config: /dev/zero is a character device, not a regular file"),
    ("{tmp}", "deepspeed.config: {tmp} is a directory, not a regular file"),
    ("{tmp}/fifo", "job.yaml:4: deepspeed.config: {tmp}/fifo is a FIFO (named pipe), not a regular file"),
    ("{tmp}/big.json", "deepspeed.config: {tmp}/big.json holds 2097153 bytes, more than the 1 MiB it may"),
    ("~no-such-user-24/ds.json", "there is no user 'no-such-user-24' on this machine"),
])
def test_a_deepspeed_config_that_is_not_a_small_regular_file_is_refused_before_reading(target, fragment, tmp_path):
    os.mkfifo(tmp_path / "fifo")  # reading it would block for ever
    with open(tmp_path / "big.json", "wb") as handle:
        handle.truncate(2 * 1024 * 1024 + 1)
    target, fragment = target.format(tmp=tmp_path), fragment.format(tmp=tmp_path)
    path = job_with(tmp_path, f"deepspeed: {{config: '{target}'}}\n")
    result = run_cli(tmp_path, "submit", path, "--dry-run", timeout=60)  # a read of the fifo would block: timeout
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_a_spec_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "job.yaml")
    result = run_cli(tmp_path, "validate", str(tmp_path / "job.yaml"), timeout=60)
    assert result.returncode == 2 and "job.yaml is a FIFO (named pipe), not a regular file" in result.stderr
    assert "Traceback" not in result.stderr


def test_ssh_files_of_an_unknown_user_or_of_the_wrong_type_are_refused(tmp_path, capsys):
    os.mkfifo(tmp_path / "kh")
    err = validate(tmp_path, CLUSTER + f"nodes: [{{host: a}}]\nssh: {{known_hosts: {tmp_path}/kh}}\n", capsys)
    assert f"spec.yaml:4: ssh.known_hosts: {tmp_path}/kh is a FIFO (named pipe), not a regular file" in err
    err = validate(tmp_path, CLUSTER + "nodes: [{host: a}]\nssh: {key_file: ~no-such-user-24/.ssh/id}\n", capsys)
    assert "ssh.key_file: '~no-such-user-24/.ssh/id': there is no user 'no-such-user-24'" in err


def test_ssh_files_not_made_yet_are_fine(tmp_path, capsys):
    accepted(tmp_path, CLUSTER + f"nodes: [{{host: a}}]\nssh: {{known_hosts: {tmp_path}/none, config_file: {tmp_path}/no}}\n",
             capsys)


@pytest.mark.parametrize("extra,fragment", [
    ("recipe: bert\nmodel: {seq_len: 1024}\n", "job.yaml:4: model: seq_len 1024 is more than bert's 512 positions; choose 1 to 512"),
    ("recipe: gpt2\nmodel: {seq_len: 2048}\n", "seq_len 2048 is more than gpt2's 1024 positions; choose 1 to 1024"),
    ("recipe: bert\nmodel: {size: huge}\n", "job.yaml:4: model: size 'huge' is not a bert size; choose one of base, large"),
    ("recipe: gpt2\nmodel: {size: base}\n", "size 'base' is not a gpt2 size; choose one of small, medium, large, xl"),
])
def test_recipe_model_options_it_cannot_build_are_refused_at_validation(extra, fragment, tmp_path):
    text = JOB.replace("entrypoint: [python, t.py]\n", "") + extra
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = run_cli(tmp_path, "validate", str(path), timeout=60)
    assert result.returncode == 2 and fragment in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["abc\n", "abc\u202e", "abc\u200b"])
def test_a_job_name_with_a_trailing_newline_or_invisible_character_is_refused(value, tmp_path, capsys):
    err = validate(tmp_path, JOB.replace("name: x", f"name: {json.dumps(value)}"), capsys)
    assert "spec.yaml:1: name: must be lowercase letters" in err


@pytest.mark.parametrize("char", ["\u202e", "\u2028", "\u200b"])
def test_invisible_and_direction_changing_characters_are_refused_in_paths(char, tmp_path, capsys):
    err = validate(tmp_path, JOB + f"data: {{path: {json.dumps('/data/' + char + 'txt.exe')}}}\n", capsys)
    assert f"data.path: contains the invisible or direction-changing character U+{ord(char):04X} at position 6" in err


@pytest.mark.parametrize("key", ["checkpoint: {dir: ", "data: {path: "])
def test_a_path_the_ranks_get_that_starts_with_a_dash_is_refused(key, tmp_path, capsys):
    err = validate(tmp_path, JOB + key + "--rm-rf}\n", capsys)
    assert "'--rm-rf' starts with '-', which the program would read as an option; write ./--rm-rf" in err


def test_a_directory_given_as_a_file_is_one_line_not_an_is_a_directory_traceback(tmp_path, home):
    """Issue 39 (Low): `launch attach JOB --cluster /tmp` ended in IsADirectoryError's traceback."""
    from tests.helpers import run_cli

    result = run_cli(home, "attach", "some-00000000", "--cluster", str(tmp_path))
    assert result.returncode == 2 and f"{tmp_path} is a directory, not a regular file" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unattended_timeout_below_the_agents_contact_period_is_refused():
    """Issue 39 (Low): watch.unattended_timeout: 1e-300 validated, and would end a supervised job at once."""
    import pytest
    from pydantic import ValidationError

    from launcher.spec.job import MIN_UNATTENDED_S, JobSpec

    for value in (1e-300, 0.5):
        with pytest.raises(ValidationError, match="greater than or equal to 5"):
            JobSpec(name="j", entrypoint=["train.py"], watch={"unattended_timeout": value})
    assert JobSpec(name="j", entrypoint=["train.py"], watch={"unattended_timeout": MIN_UNATTENDED_S}).watch.unattended_timeout == 5
