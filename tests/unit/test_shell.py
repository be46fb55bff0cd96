"""Hostile strings survive the one quoting function unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.plan.shell import mask, render_command

HOSTILE = ["a;b", "$(id)", "`id`", "it's", 'say "hi"', "two words", "line\nbreak", "naïve ☃ 漢字", "", "-rf", "*", "\\"]
ECHO = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('V'), os.getcwd()]))"


def run_through_bash(argv, env, cwd):
    out = subprocess.run(["bash", "-c", render_command(argv, env, cwd)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_hostile_strings_reach_the_program_verbatim(tmp_path):
    weird_dir = tmp_path / "dir with 'quotes' and $(x)"
    weird_dir.mkdir()
    for value in HOSTILE:
        args, env_value, cwd = run_through_bash([sys.executable, "-c", ECHO, value, "x"], {"V": value}, str(weird_dir))
        assert args == [value, "x"] and env_value == value and cwd == str(weird_dir)


text_without_nul = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@settings(max_examples=40, deadline=None)
@given(st.lists(text_without_nul, min_size=1, max_size=4), text_without_nul)
def test_any_text_round_trips(args, value):
    got_args, got_value, _ = run_through_bash([sys.executable, "-c", ECHO, *args], {"V": value}, None)
    assert got_args == args and got_value == value


def test_mask_hides_every_secret_value():
    line = "token=s3cr3t and again s3cr3t, other=abc"
    assert mask(line, {"A": "s3cr3t", "B": "abc"}) == "token=**** and again ****, other=****"


def test_a_workdir_starting_with_a_dash_is_a_directory_for_dash_and_bash(tmp_path):
    for name in ("-x", "-", "--", "-P"):
        (tmp_path / name).mkdir()
    for shell in ("dash", "bash"):
        for name in ("-x", "-", "--", "-P"):
            out = subprocess.run(
                [shell, "-c", f"cd {tmp_path} && " + render_command(["pwd"], None, name)],
                capture_output=True, text=True, env={"OLDPWD": "/", "CDPATH": "/", "PATH": "/usr/bin:/bin"},
            )
            assert (out.returncode, out.stdout.strip(), out.stderr) == (0, str(tmp_path / name), ""), (shell, name)


def test_a_program_that_reads_as_an_option_is_refused():
    with pytest.raises(ValueError, match="would be read as an option"):
        render_command(["-rf", "x"])


PEM = """-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACCEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEAAAAJgAAAAAAAAA
short
-----END OPENSSH PRIVATE KEY-----
"""
CREDENTIAL = '{\n  "type": "service_account",\n  "private_key_id": "0123456789abcdef",\n  "x": 1\n}'


def test_every_line_of_a_multi_line_secret_is_masked_where_it_appears():
    secrets = {"SSH_KEY": PEM, "GCP": CREDENTIAL}
    log = [
        "cat key: -----BEGIN OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
        "[0/1] QyNTUxOQAAACCEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEAAAAJgAAAAAAAAA trailing",
        "short",
        '    "private_key_id": "0123456789abcdef",',
        'reindented: "private_key_id": "0123456789abcdef",',
        "a message quoting the whole value: " + PEM,
    ]
    masked = [mask(line, secrets) for line in log]
    assert masked[:6] == [
        "cat key: ****", "****", "[0/1] **** trailing", "short", "  ****", "reindented: ****",
    ]
    assert masked[6] == "a message quoting the whole value: ****"


secret_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(secret_text, st.text(max_size=20), st.text(max_size=20), st.data())
def test_no_line_of_8_characters_or_more_of_a_secret_survives_masking(secret, before, after, data):
    """Whatever the secret and the text around it, the masked line holds none of the secret's long lines."""
    lines = [line for line in secret.split("\n") if len(line) >= 8]
    shown = data.draw(st.sampled_from(lines)) if lines else secret
    out = mask(before + shown + after, {"S": secret})
    for line in lines:
        assert line not in out
    if len(secret) > 4:
        assert secret not in out
