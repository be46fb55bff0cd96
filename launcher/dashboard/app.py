"""The dashboard's Starlette application: pages, JSON, server-sent events, static files; a token where it is bound
to more than loopback."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from launcher.dashboard import data, exporter, pages, stream
from launcher.dashboard.cluster import Leases
from launcher.errors import JobNotFound, LaunchError
from launcher.store.db import Store
from launcher.store.states import JobState
from launcher.views.logs import LogQuery

STATIC = Path(__file__).parent / "static"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches this machine's own users only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TokenGate(BaseHTTPMiddleware):
    """Refuses (403) a request without the token (``?token=`` or ``Authorization: Bearer``)."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: Any) -> Response:
        given = request.query_params.get("token") or request.headers.get("authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return PlainTextResponse("launch dashboard: a token is needed (printed where the dashboard was started)\n",
                                     status_code=403)
        return await call_next(request)


def create_app(store: Store, token: str | None = None, leases: Leases | None = None, user: str = "",
               metrics_only: bool = False) -> Starlette:
    """The application over a (read-only) store; ``token``: required of every request when given; ``leases``: the
    cluster file's nodes (the Cluster page, and lease series in /metrics); ``user``: the store's owner, the user of its jobs
    stored before launch recorded who submitted each; ``metrics_only``: /metrics and nothing else."""

    def _token(request: Request) -> str | None:
        return request.query_params.get("token") if token else None

    async def jobs_page(request: Request) -> Response:
        return HTMLResponse(pages.jobs_page(_token(request)))

    async def job_page(request: Request) -> Response:
        return HTMLResponse(pages.job_page(data.job(store, request.path_params["job"]), _token(request)))

    async def compare_page(request: Request) -> Response:
        refs = [r for r in request.query_params.get("jobs", "").split(",") if r.strip()]
        table = data.compare(store, [r.strip() for r in refs]) if refs else None
        return HTMLResponse(pages.compare_page(table, refs, _token(request)))

    async def jobs_json(request: Request) -> Response:
        return JSONResponse(data.jobs(store, limit=_limit(request), owner=user))

    async def jobs_events(request: Request) -> Response:
        limit = _limit(request)
        return _sse(stream.changes(lambda: data.jobs(store, limit=limit, owner=user), lambda _: False))

    async def job_json(request: Request) -> Response:
        return JSONResponse(data.job(store, request.path_params["job"]))

    async def series_events(request: Request) -> Response:
        ref = request.path_params["job"]
        return _sse(stream.changes(lambda: data.series(store, ref), lambda value: JobState(value["state"]).terminal))

    async def log_events(request: Request) -> Response:
        query = _log_query(request)
        store.job(request.path_params["job"])  # an unknown job is a 404 now, not an empty stream
        return _sse(stream.log_events(store, request.path_params["job"], query, request.headers.get("last-event-id")))

    async def cluster_page(request: Request) -> Response:
        return HTMLResponse(pages.cluster_page(leases.cluster.name if leases else None, _token(request)))

    async def cluster_events(request: Request) -> Response:
        if leases is None:
            raise LaunchError("no cluster file: start the dashboard with --cluster FILE to see its nodes")
        return _sse(stream.changes(lambda: leases.read().as_json(), lambda _: False, poll_s=leases.every_s))

    async def metrics(request: Request) -> Response:
        per_rank = request.query_params.get("ranks", "") in ("1", "true", "yes")
        reading = await asyncio.to_thread(leases.read) if leases else None
        scrape = exporter.Scrape(store, user, per_rank, None if reading is None else reading.nodes)
        return Response(await asyncio.to_thread(exporter.exposition, scrape), media_type=exporter.CONTENT_TYPE)

    async def launch_error(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(f"{exc}\n", status_code=404 if isinstance(exc, JobNotFound) else 400)

    routes: list[BaseRoute] = [Route("/metrics", metrics)]
    if not metrics_only:
        routes += [
            Route("/", jobs_page), Route("/jobs/{job}", job_page), Route("/compare", compare_page),
            Route("/cluster", cluster_page), Route("/api/cluster/events", cluster_events),
            Route("/api/jobs", jobs_json), Route("/api/jobs/events", jobs_events), Route("/api/jobs/{job}", job_json),
            Route("/api/jobs/{job}/series", series_events), Route("/api/jobs/{job}/logs", log_events),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    middleware = [Middleware(TokenGate, token=token)] if token else []
    return Starlette(routes=routes, middleware=middleware, exception_handlers={LaunchError: launch_error})


def _sse(events: Any) -> Response:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


def _limit(request: Request) -> int | None:
    text = request.query_params.get("limit", "")
    return int(text) if text.isdigit() else None


def _log_query(request: Request) -> LogQuery:
    params = request.query_params
    node, rank, pattern = params.get("node", ""), params.get("rank", ""), params.get("pattern", "")
    try:
        compiled = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise LaunchError(f"the regular expression {pattern!r} does not compile: {exc}") from None
    return LogQuery(node=int(node) if node.isdigit() else None, rank=int(rank) if rank.isdigit() else None,
                    pattern=compiled)
