"""The job store's file: SQLite in WAL mode under ``$LAUNCH_HOME`` (default ``~/.launch``).

The directory is private to its user (0700; when LAUNCH_HOME is a symlink, the directory it
points to is left as its owner made it) and the database file too (0600). Every SQLite error (a
corrupted file, a locked or read-only one) becomes a ``StoreError`` that names the file and
what to do.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from launcher.spec.files import expand_user
from launcher.store.schema import StoreError, StoreLocked, migrate


def launch_home() -> Path:
    """Where the store and run directories live: ``$LAUNCH_HOME`` or ``~/.launch`` (SpecError for ``~nobody``)."""
    return expand_user(os.environ.get("LAUNCH_HOME") or "~/.launch", "LAUNCH_HOME")


BUSY_TIMEOUT_S = 30.0  # how long a command waits for another one's write to the store
WAL_RETRY_S = 0.01


class StoreBase:
    """The store's file and its one connection: opened private, migrated, every SQLite error a StoreError."""

    def __init__(self, home: Path | None = None, read_only: bool = False) -> None:
        self.home = home or launch_home()
        self.runs = self.home / "runs"
        self.path = self.home / "jobs.db"
        self._lock = threading.Lock()
        if read_only:
            self._open_read_only()
            return
        try:
            self.runs.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.home.is_symlink():  # a link's target is someone's directory: its mode is not launch's to set
                os.chmod(self.home, 0o700)
            self._create_private()
        except OSError as exc:
            raise StoreError(f"cannot open the job store in {self.home}: {exc}", hint="set LAUNCH_HOME to a writable directory") from None
        with self._guard():
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._write_ahead_log()
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()

    def _open_read_only(self) -> None:
        """A reader's connection (``mode=ro``: the dashboard): it never writes, migrates or locks out a supervisor."""
        if not self.path.exists():
            raise StoreError(f"no job store in {self.home} yet", hint="submit a job first, or set LAUNCH_HOME")
        with self._guard():
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                       check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def _write_ahead_log(self) -> None:
        """Put the file in WAL mode. On a new file that another process is switching at the same moment (two
        `launch` commands using a store for the first time), SQLite answers "database is locked" at once, without
        waiting in its busy handler (seen 8 times in 80 pairs): try again until the busy timeout has passed."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(WAL_RETRY_S)

    def _create_private(self) -> None:
        """Create the database file 0600 if it is not there. An existing one is never opened here: closing any
        descriptor of it drops every POSIX lock this process holds on it, SQLite's included, so a second Store in
        a process (or a test polling status in process) would let readers in mid-checkpoint ("malformed")."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            return
        os.close(fd)

    def _migrate(self) -> None:
        migrate(self._db, self.path)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite errors as a StoreError naming the file and what to do."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text or "corrupt" in text):
            return StoreError(
                f"the job store {self.path} is corrupted ({text})",
                hint=f"move it aside (mv {shlex.quote(str(self.path))} {shlex.quote(str(self.path))}.broken) and run launch "
                     f"again: it makes a new, empty store; the jobs' logs stay under {self.runs}",
            )
        if "locked" in text or "busy" in text:
            return StoreLocked(f"the job store {self.path} is locked by another process ({text})",
                              hint="try again when the other launch command is done")
        return StoreError(f"the job store {self.path} failed: {text}",
                          hint="check the disk and the file's permissions, or set LAUNCH_HOME to another directory")

    @contextlib.contextmanager
    def waiting_at_most(self, seconds: float) -> Iterator[None]:
        """Writes in this block wait at most ``seconds`` for another process's write lock (then ``StoreLocked``):
        the supervisor's loop files its rounds this way, so a store held by a backup or a ``sqlite3`` shell never
        holds up its verdicts. The connection is shared: another thread's write meanwhile waits as briefly."""
        with self._lock, self._guard():
            self._db.execute(f"PRAGMA busy_timeout = {max(0, int(seconds * 1000))}")
        try:
            yield
        finally:
            with self._lock, self._guard():
                self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def close(self) -> None:
        with self._guard():
            self._db.close()

    def _execute(self, sql: str, params: tuple | list = ()) -> int:
        """Run one write; the number of rows it changed."""
        with self._lock, self._guard():
            return self._db.execute(sql, params).rowcount

    def _query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        """Run one read and fetch every row (a damaged page fails here, inside the guard)."""
        with self._lock, self._guard():
            return self._db.execute(sql, params).fetchall()

    def _transaction(self, *statements: tuple[str, list[tuple]]) -> None:
        """Each statement for each of its parameter rows, in order, in one transaction (none without rows)."""
        with self._lock, self._guard():
            self._db.execute("BEGIN")
            try:
                for sql, rows in statements:
                    if rows:
                        self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def run_dir(self, job_id: str) -> Path:
        """The job's private directory for logs and pid files (created 0700)."""
        path = self.runs / job_id
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path
