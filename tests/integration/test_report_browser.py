"""`launch report` opened in a real headless Chromium: the plots must render (no network, no scripts).

Needs Debian's chromium (`apt-get install -y chromium`); skipped without it.
The screenshot is decoded with a small stdlib PNG reader and must show the
report's plot colours, not a blank page. Pure chart helpers are tested here too.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from launcher.metrics.record import MetricRecord
from launcher.views import report
from tests.integration.test_metrics_cli import (
    run_launch,
    submit,
    write_cluster,
    write_job,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_rows(path: Path) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, unfiltered rows) of an 8-bit RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG file"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat.append(body)
    width, height, depth, color = header
    assert depth == 8 and color in (2, 6), f"unexpected PNG format: depth {depth}, colour type {color}"
    bpp = 3 if color == 2 else 4
    stride, raw = width * bpp, zlib.decompress(b"".join(idat))
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif kind in (1, 3, 4):
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up = prev[i]
                if kind == 1:
                    line[i] = (line[i] + left) & 255
                elif kind == 3:
                    line[i] = (line[i] + (left + up) // 2) & 255
                else:
                    corner = prev[i - bpp] if i >= bpp else 0
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        prev = rows[-1]
    return width, height, bpp, rows


def _hex(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_its_plots_in_headless_chromium(tmp_path) -> None:
    cluster = write_cluster(tmp_path)
    job = submit(tmp_path, write_job(tmp_path, "strag", {"SLOW_RANK": "1", "SLOW_SLEEP": "0.02", "PEAK_MB": "150"}), cluster)
    done = run_launch(tmp_path, "report", job, "--out", "report.html")
    assert done.returncode == 0, done.stderr
    shot = tmp_path / "report.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", f"--screenshot={shot}", "--window-size=1200,1600",
         (tmp_path / "report.html").as_uri()],
        capture_output=True, timeout=90, check=True,
    )
    width, height, bpp, rows = png_rows(shot)
    assert (width, height) == (1200, 1600)
    colors = {row[x:x + 3] for row in rows[::2] for x in range(0, width * bpp, bpp * 2)}
    assert len(colors) > 50, f"screenshot looks blank: {len(colors)} colours"
    # The first series' line and bars are drawn in the palette's first colour.
    assert bytes(_hex(report.PALETTE[0])) in colors, "no plot drawn in the screenshot"


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert report.nice_ticks(0, 224) == [0, 50, 100, 150, 200, 250]
    assert report.nice_ticks(2, 12) == [2, 4, 6, 8, 10, 12]
    ticks = report.nice_ticks(0.08, 0.5)
    assert ticks[0] <= 0.08 and ticks[-1] >= 0.5 and len(ticks) <= 7
    assert report.nice_ticks(5, 5)[-1] >= 5


def test_charts_escape_labels_and_say_when_there_is_no_data() -> None:
    svg = report.line_chart("t", [("<b>&x", [(1, 2.0), (2, 3.0)])], "step", "y")
    assert "&lt;b&gt;&amp;x" in svg and "<b>" not in svg and "<polyline" in svg
    assert "no data" in report.line_chart("empty", [("a", [])], "step", "y")
    assert "no data" in report.bar_chart("empty", [], [], "rank", "MB")
    bars = report.bar_chart("m", ["rank 0", "rank 1"], [("a", [100.0, None]), ("b", [50.0, 60.0])], "rank", "MB")
    assert bars.count("<rect") == 3 + 2  # three bars, two legend swatches


def test_series_sum_ranks_per_step_and_use_the_latest_attempt() -> None:
    records = [
        MetricRecord(rank=0, step=2, samples_per_sec=10.0, loss=1.0, attempt=0),
        MetricRecord(rank=0, step=2, samples_per_sec=30.0, loss=3.0, attempt=1),
        MetricRecord(rank=1, step=2, samples_per_sec=40.0, loss=5.0, attempt=1),
        MetricRecord(rank=0, step=4, samples_per_sec=50.0, loss=None, attempt=1),
    ]
    assert report.throughput_series(records) == [(2, 70.0), (4, 50.0)]
    assert report.loss_series(records) == [(2, 4.0)]
