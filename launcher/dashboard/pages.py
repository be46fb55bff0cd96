"""The dashboard's HTML pages: every value escaped here; live parts are filled by static/dashboard.js."""

from __future__ import annotations

import time
from html import escape
from typing import Any


def _e(value: Any) -> str:
    return escape("-" if value is None else str(value), quote=True)


def _when(t: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "-"


def page(title: str, body: str, token: str | None, script: str = "", after: str = "") -> str:
    """A whole page; ``token`` travels with every link and request the page makes. ``script`` starts the live parts
    once ``body`` is parsed; ``after`` is parsed while they load (a big job's events and plan: 200 KB for 125 nodes)."""
    q = f"?token={_e(token)}" if token else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)} · launch</title>
<link rel="stylesheet" href="/static/uPlot.min.css{q}"><link rel="stylesheet" href="/static/dashboard.css{q}">
<script src="/static/uPlot.iife.min.js{q}"></script><script src="/static/dashboard.js{q}"></script>
</head><body data-token="{_e(token or '')}"><nav><a href="/{q}">Jobs</a> <a href="/compare{q}">Compare</a> <a href="/cluster{q}">Cluster</a></nav>
<h1>{_e(title)}</h1>{body}
<script>{script}</script>{after}</body></html>"""


def jobs_page(token: str | None) -> str:
    body = """<form id="filter">state <select name="state"><option value="">any</option>
<option>QUEUED</option><option>PENDING</option><option>RUNNING</option><option>SUCCEEDED</option>
<option>FAILED</option><option>CANCELLED</option></select> name <input name="name"></form>
<table id="jobs"><thead><tr><th>job</th><th>state</th><th>user</th><th>cluster</th><th>nodes x ranks</th>
<th>progress</th><th>ETA</th><th>samples/s</th><th>peak mem</th><th>started</th><th>duration</th></tr></thead>
<tbody></tbody></table>"""
    return page("Jobs", body, token, "launchJobs();")


def job_page(job: dict[str, Any], token: str | None) -> str:
    """A job: what `launch status JOB` shows, its plan per node, events, live logs and plots."""
    facts = [("state", job.get("state")), ("reason", job.get("reason")), ("first failure", _failure(job.get("first_failure"))),
             ("backend", job.get("backend")), ("cluster", job.get("cluster")), ("strategy", job.get("strategy")),
             ("nodes x ranks", f"{job.get('nnodes')} x {job.get('nproc_per_node')}"), ("attempt", job.get("attempt")),
             ("created", _when(job.get("created_at"))), ("started", _when(job.get("started_at"))),
             ("ended", _when(job.get("ended_at")))]
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    verdict = "".join(f"{_e(line)}\n" for line in job.get("verdict_lines") or ())
    events = "".join(f"<tr><td>{_e(_when(ev.get('t')))}</td><td>{_e(ev.get('kind'))}</td><td>{_e(ev.get('message'))}</td></tr>"
                     for ev in job.get("events") or ())
    plan = "".join(
        f"<h3>node {_e(n['node'])} · {_e(n['host'])} · {_e(n['nproc'])} ranks</h3><pre>{_e(' '.join(n['argv']))}</pre>"
        "<table class=env>" + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td><td>{_e(src)}</td></tr>" for k, v, src in n["env"])
        + "</table>" for n in job.get("plan_nodes") or ())
    body = f"""<table class=facts>{rows}</table>
{f'<h2>Verdict</h2><pre class=verdict>{verdict}</pre>' if verdict else ''}
<h2>Plots</h2><div id="plots"></div>
<h2>Logs</h2><form id="logfilter">node <input name="node" size=3> rank <input name="rank" size=3>
regex <input name="pattern"> <label><input type=checkbox name=follow checked> follow</label></form>
<pre id="logs"></pre>"""
    after = f"""<h2>Events</h2><table class=events>{events}</table>
<h2>Plan</h2>{plan}"""
    return page(f"Job {job.get('id')}", body, token, f"launchJob({_js(job.get('id'))});", after)


def cluster_page(cluster: str | None, token: str | None) -> str:
    """Each node's GPUs or slots, free or held by which job of which user since when (`launch queue`), live."""
    if cluster is None:
        return page("Cluster", "<p>No cluster file: start the dashboard with <code>--cluster FILE</code> to see who "
                    "holds each GPU or slot of its nodes.</p>", token)
    body = """<p id="read">reading every node's leases...</p>
<table id="cluster"><thead><tr><th>node</th><th>kind</th><th>device</th><th>held by</th></tr></thead><tbody></tbody></table>
<h2>Waiting, in the order they start</h2><ol id="waiting"></ol>"""
    return page(f"Cluster {cluster}", body, token, "launchCluster();")


def _failure(failure: Any) -> Any:
    """A stored first failure as one line: its kind, where, and its reason (or the line it names)."""
    if not isinstance(failure, dict):
        return failure
    where = " ".join(f"{k} {failure[k]}" for k in ("node", "rank", "step") if failure.get(k) is not None)
    said = failure.get("reason") or failure.get("line") or ""
    return " ".join(str(p) for p in (failure.get("kind"), f"({where})" if where else "", said) if p) or None


def compare_page(table: dict[str, Any] | None, refs: list[str], token: str | None) -> str:
    """The `launch compare` table of the jobs named (``?jobs=A,B``)."""
    form = f"""<form>jobs (comma-separated, first the baseline) <input name="jobs" size=60 value="{_e(','.join(refs))}">
{f'<input type=hidden name=token value="{_e(token)}">' if token else ''}<button>compare</button></form>"""
    if not table:
        return page("Compare", form, token)
    head = "".join(f"<th>{_e(h)}</th>" for h in table["headers"])
    rows = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in table["rows"])
    return page("Compare", f"{form}<table id=compare><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>", token)


def _js(value: Any) -> str:
    """A string as a JavaScript literal safe inside a <script> element."""
    import json

    return json.dumps(str(value)).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
