"""Where a node's run roots are (launcher/node/rundir.py, docs/JOURNALS.md "Run directories"): the root new run
directories go in is one no other user can make first or take the place of, and every reader finds a job in any of
this user's roots. The /tmp of these tests is a sticky world-writable directory of the test's own."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from launcher.node import follow, rundir

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's directory needs root")
OTHER = 12345  # the co-tenant's uid


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /tmp of the test's own (mode 1777), and no runtime directory."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(rundir, "TMP_DIR", str(shared))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return shared


def _made(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(f"launch-{os.getuid()}-*"))


def test_without_a_runtime_directory_the_root_is_made_once_under_a_random_name_and_found_again(tmp: Path) -> None:
    root = Path(rundir.run_root())
    assert re.fullmatch(rf"launch-{os.getuid()}-[0-9a-f]{{12}}", root.name) and root.parent == tmp
    assert root.stat().st_mode & 0o777 == 0o700 and root.stat().st_uid == os.getuid()
    assert rundir.run_root() == str(root) and _made(tmp) == [root], "found again, not made again"
    run_dir = rundir.job_run_dir("job-1")
    assert run_dir == str(root / "job-1") and rundir.existing_run_dir("job-1") == run_dir
    assert rundir.roots() == [str(root)]


@AS_ROOT
def test_what_another_user_planted_at_the_roots_names_is_skipped_never_used(tmp: Path) -> None:
    uid = os.getuid()
    legacy = tmp / f"launch-{uid}"  # the root before, made first by the co-tenant
    legacy.mkdir(mode=0o700)
    os.chown(legacy, OTHER, OTHER)
    first = tmp / f"launch-{uid}-000000000000"  # sorts before any the user makes
    first.mkdir(mode=0o700)
    os.chown(first, OTHER, OTHER)
    mine = tmp / "elsewhere"
    mine.mkdir(mode=0o700)
    (tmp / f"launch-{uid}-000000000001").symlink_to(mine)  # a symlink to a directory of this user's
    os.lchown(tmp / f"launch-{uid}-000000000001", OTHER, OTHER)
    (tmp / f"launch-{uid}-000000000002").write_text("")  # a file
    root = rundir.run_root()
    assert root not in {str(first), str(legacy)} and Path(root).stat().st_uid == uid
    assert rundir.roots() == [root], "none of the planted names is a root of this user's"
    assert rundir.job_run_dir("job-1") == os.path.join(root, "job-1")
    assert os.listdir(first) == [] and os.listdir(legacy) == [] and os.listdir(mine) == []


def test_two_roots_made_at_once_agree_on_the_first_and_a_job_in_the_second_is_still_found(tmp: Path) -> None:
    uid = os.getuid()
    later, earlier = tmp / f"launch-{uid}-ffffffffffff", tmp / f"launch-{uid}-000000000000"
    later.mkdir(mode=0o700)
    in_later = rundir.job_run_dir("job-1")  # made before the other agent's root existed
    earlier.mkdir(mode=0o700)
    assert in_later == str(later / "job-1")
    assert rundir.run_root() == str(earlier) and rundir.roots() == [str(earlier), str(later)]
    assert rundir.existing_run_dir("job-1") == in_later and rundir.job_run_dir("job-1") == in_later, "not made again"
    assert rundir.job_run_dir("job-2") == str(earlier / "job-2")


def test_a_job_under_the_old_root_is_found_and_cleaned_and_new_jobs_go_in_the_new_root(tmp: Path) -> None:
    legacy = tmp / f"launch-{os.getuid()}"
    old = rundir.job_run_dir("old-job", str(legacy))
    assert rundir.existing_run_dir("old-job") == old
    new = rundir.job_run_dir("new-job")
    assert Path(new).parent != legacy and rundir.roots() == [str(Path(new).parent), str(legacy)]
    removed, kept = follow.clean_dirs(None, 0.0)
    assert sorted(removed) == ["new-job", "old-job"] and kept == {}
    assert rundir.existing_run_dir("old-job") is None and rundir.existing_run_dir("new-job") is None


def test_a_runtime_directory_is_the_root_only_when_it_is_this_users_and_closed(tmp: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    rundir.job_run_dir("job-1", str(tmp / f"launch-{os.getuid()}"))  # a job under /tmp, with no runtime directory
    assert rundir.run_root() == str(runtime / "launch") and rundir.roots() == [str(runtime / "launch")], \
        "where it is the root, it is the only one (launch clean and the sweep read it alone)"
    runtime.chmod(0o755)
    assert Path(rundir.run_root()).parent == tmp, "open to others: not a private place"
    runtime.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(runtime)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(link))
    assert Path(rundir.run_root()).parent == tmp, "a symlink: not the runtime directory itself"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert Path(rundir.run_root()).parent == tmp
    if os.geteuid() == 0:
        os.chown(runtime, OTHER, OTHER)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        assert Path(rundir.run_root()).parent == tmp, "another user's"


def test_a_root_of_this_users_opened_to_others_is_refused_with_the_fix(tmp: Path) -> None:
    root = Path(rundir.run_root())
    root.chmod(0o755)
    with pytest.raises(rundir.RunDirError, match=f"open to other users .*`chmod 700 {root}`"):
        rundir.job_run_dir("job-1")


def test_a_tmp_others_may_change_without_its_sticky_bit_is_refused(tmp: Path) -> None:
    tmp.chmod(0o777)
    with pytest.raises(rundir.RunDirError, match="may be changed by other users"):
        rundir.run_root()
    assert _made(tmp) == [], "nothing made there"
