"""`launch dashboard`: serve the read-only web view of the job store (imports the web stack only when run)."""

from __future__ import annotations

import click

from launcher.errors import LaunchError


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback needs the token printed at start.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--cluster", "cluster_file", type=click.Path(exists=True, dir_okay=False),
              help="Cluster file: the Cluster page (who holds each GPU or slot, as `launch queue`) and lease series "
                   "in /metrics.")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in this machine's browser.")
@click.option("--metrics-only", is_flag=True, help="Serve /metrics (Prometheus) and nothing else.")
def dashboard(host, port, cluster_file, open_browser, metrics_only):
    """Serve a live, read-only web view of the jobs in the store.

    Pages: Jobs (every job, newest first, live), a job (its plan per node with secrets masked,
    events, the verdict as `launch status JOB` shows it, live logs per node and rank with a
    regex filter, plots of samples/s, step time, loss and memory per rank), and Compare (the
    `launch compare` table of chosen jobs), and with --cluster the Cluster page (each node's
    GPUs or slots, free or held by which job of which user since when, live). Nothing on it
    starts or stops a job. GET /metrics serves the same figures to Prometheus (?ranks=1: per rank).

    It binds to loopback by default: from a laptop, forward the port over SSH. A
    non-loopback --host prints a token: every request must carry it (?token=...).

    \b
    Examples:
      launch dashboard                               http://127.0.0.1:8765/
      ssh -L 8765:127.0.0.1:8765 gpu-head            (on the laptop) then open that URL
      launch dashboard --host 0.0.0.0 --port 9000    team-wide, behind the printed token
      launch dashboard --cluster cluster.yaml        with the Cluster page
      launch dashboard --metrics-only --port 9101    a Prometheus exporter only
    Needs the extra: pip install 'launch[dashboard]'. See docs/DASHBOARD.md.
    """
    import getpass
    import secrets

    try:
        import uvicorn

        from launcher.dashboard.app import create_app, is_loopback
        from launcher.dashboard.cluster import Leases
    except ImportError as exc:
        raise LaunchError(f"launch dashboard needs its web stack ({exc.name} is missing)",
                          hint="pip install 'launch[dashboard]'") from None
    from launcher.run.orchestrate import load_cluster_spec
    from launcher.store.db import Store

    leases = Leases(load_cluster_spec(cluster_file)) if cluster_file else None
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    app = create_app(Store(read_only=True), token, leases, getpass.getuser(), metrics_only)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + ("metrics" if metrics_only else "") + (f"?token={token}" if token else "")
    click.echo(f"launch dashboard: {url}" + ("" if token else "  (loopback only: ssh -L to reach it from elsewhere)"))
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    uvicorn.run(app, host=host, port=port, log_level="warning")
