"""Hostile strings survive the one quoting function unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.shell import mask, render_command

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
