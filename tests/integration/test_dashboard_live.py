"""`launch dashboard` over a running 2-node job on the SSH test bed (bed "b": two namespace hosts reached over real
sshd, one slot each), seen by a real Prometheus (Debian's) and a real headless Chromium (Debian's, driven by Playwright).

One job serves every check (the CI budget): it steps every 0.2 s, printing a line and reporting 8 samples a step on
each rank, until the test creates its release file; then it hangs (tests/programs/dash_train.py) and is called hung.
Screenshots of each page are kept in the test's directory (``dashboard-*.png``).
"""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env, launch_argv, run_cli, status_json, wait_for, wait_for_state, write_yaml
from tests.testbed_fixture import needs_root
from tools import testbed as tb

pytestmark = [needs_root, pytest.mark.testbed, pytest.mark.slow]
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright drives Chromium (launch[dev])")

PROGRAM = ROOT / "tests" / "programs" / "dash_train.py"
CHROMIUM = shutil.which("chromium")
PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def prometheus_value(base: str, query: str) -> float | None:
    """The first value of an instant query to Prometheus' query API, None while it has none."""
    answer = get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
    assert isinstance(answer, dict) and answer["status"] == "success", answer
    found = answer["data"]["result"]
    return float(found[0]["value"][1]) if found else None


def scraped_by_prometheus(tmp_path: Path, port: int, job_id: str) -> tuple[float, float]:
    """A real Prometheus scrapes the dashboard's /metrics each second; the job's samples/s and the slots it holds,
    as its query API returns them."""
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [
        {"job_name": "launch", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    web = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{web}"
    try:
        assert wait_for(lambda: up(f"{base}/-/ready"), timeout=60), (tmp_path / "prometheus.log").read_text()[-3000:]
        rate = wait_for(lambda: prometheus_value(base, f'launch_job_samples_per_second{{job_id="{job_id}"}}'),
                        timeout=60)
        held = wait_for(lambda: prometheus_value(base, f'sum(launch_node_devices_held{{job_id="{job_id}"}})'),
                        timeout=30)
        return rate, held
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.mark.skipif(CHROMIUM is None or PROMETHEUS is None,
                    reason="needs Debian's chromium and prometheus (scripts/setup.sh --test installs them)")
def test_a_running_two_node_job_in_prometheus_and_on_every_page_in_chromium(testbed: tb.Testbed, tmp_path: Path,
                                                                            home: Path) -> None:
    hosts = testbed.hosts[-2:]  # the bed's last two: neither runs the session's Slurm daemons nor its Ray node
    cluster = write_yaml(tmp_path / "cluster.yaml", {
        "name": "dash-ssh", "backend": "ssh", "python": sys.executable, "workdir": str(tmp_path),
        "ssh": {"user": "root", "key_file": str(testbed.key_file), "known_hosts": str(testbed.known_hosts),
                "config_file": str(testbed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0, "slots": 1} for h in hosts]})
    release = tmp_path / "release"
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "dash-live", "entrypoint": ["python", str(PROGRAM)], "resources": {"nodes": 2, "nproc_per_node": 1},
        "watch": {"stall_timeout": 8, "grace_period": 1}, "env": {"TEST_RELEASE": str(release)}})
    submitted = run_cli(home, "submit", str(job), "--cluster", str(cluster), "--detach")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    port = free_port()
    dash_log = (tmp_path / "dashboard.log").open("w")
    dashboard = subprocess.Popen(launch_argv("dashboard", "--port", str(port), "--cluster", str(cluster)),
                                 env=cli_env(home), cwd=ROOT, stdout=dash_log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for_state(home, job_id, ("RUNNING",))["state"] == "RUNNING"
        assert wait_for(lambda: up(f"{base}/api/jobs"), timeout=60), (tmp_path / "dashboard.log").read_text()

        rate, held = scraped_by_prometheus(tmp_path, port, job_id)
        assert 10 < rate <= 80.5, f"2 ranks x 8 samples every 0.2 s at most: {rate}"
        assert held == 2, "one slot on each of the two nodes"

        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})

            page.goto(f"{base}/")
            row = page.locator("#jobs tbody tr", has_text=job_id)
            row.wait_for(timeout=30_000)
            cells = row.locator("td").all_inner_texts()
            assert cells[1:4] == ["RUNNING", getpass.getuser(), "dash-ssh"], cells  # state, who submitted it, cluster
            page.screenshot(path=str(tmp_path / "dashboard-jobs.png"), full_page=True)

            page.goto(f"{base}/jobs/{job_id}")
            lines = page.locator("#logs")
            page.wait_for_function("document.getElementById('logs').textContent.includes('step')", timeout=30_000)
            first = lines.inner_text().count("\n")
            page.wait_for_function(f"document.getElementById('logs').textContent.split('\\n').length > {first + 4}",
                                   timeout=30_000)  # live lines arrive
            assert "rank 0 step" in lines.inner_text() and "rank 1 step" in lines.inner_text()
            page.wait_for_selector("#plots canvas", timeout=30_000)
            points = int(page.locator("#plots").get_attribute("data-points") or 0)
            page.wait_for_function(f"Number(document.getElementById('plots').dataset.points) > {points}",
                                   timeout=30_000)  # the plot updates
            page.screenshot(path=str(tmp_path / "dashboard-job.png"), full_page=True)

            page.goto(f"{base}/cluster")
            held_rows = page.locator("#cluster tbody tr.held", has_text=f"job {job_id} (user ")
            page.wait_for_function("document.querySelectorAll('#cluster tbody tr.held').length >= 2", timeout=30_000)
            assert held_rows.count() == 2, page.locator("#cluster").inner_text()
            page.screenshot(path=str(tmp_path / "dashboard-cluster.png"), full_page=True)

            release.touch()  # the ranks stop stepping: the last sleeps, the others wait for it in a barrier
            assert wait_for_state(home, job_id, ("FAILED",), timeout=120)["state"] == "FAILED"
            page.goto(f"{base}/jobs/{job_id}")
            verdict = page.locator("pre.verdict").inner_text()
            assert verdict.startswith("verdict: hung at step "), verdict
            assert f"rank 0 (node 0 {hosts[0].name}, local rank 0): barrier <- <module> dash_train.py" in verdict, verdict
            assert f"rank 1 (node 1 {hosts[1].name}, local rank 0): <module> dash_train.py" in verdict, verdict
            page.screenshot(path=str(tmp_path / "dashboard-hung.png"), full_page=True)
            browser.close()
        for name in ("jobs", "job", "cluster", "hung"):
            assert (tmp_path / f"dashboard-{name}.png").stat().st_size > 10_000, name
    finally:
        release.touch()
        if status_json(home, job_id)["state"] not in ("FAILED", "SUCCEEDED", "CANCELLED"):
            run_cli(home, "cancel", job_id)
        dashboard.terminate()
        dashboard.wait(timeout=30)
        dash_log.close()
