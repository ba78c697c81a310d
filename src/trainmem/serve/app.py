"""The web app: a Starlette application whose routes each parse a request, ask `Answers` and render `page`.

Starlette, not Gradio or FastAPI: two small pure-Python packages (starlette, uvicorn) on top of what trainmem
already installs, which start in well under a second on 2 cores, and a test client (`starlette.testclient`)
that drives every route without a browser. The page is server-rendered HTML that a 170-line script
(`static/serve.js`) refreshes as the form changes.

Routes: `/` the page; `/api/estimate` every card's answer (HTML fragments + the rows as JSON), or what is
being done while a lookup or a first answer is under way; `/api/result.json` the same as a download;
`/api/retry` runs a setup's timed-out simulations again; `/api/config` keeps an uploaded config.json;
`/api/plan` runs `trainmem plan` for the chosen card; `/api/report` turns an uploaded JSONL into `trainmem report`'s page,
served at `/report/{id}`. Bad input is a 422 whose `problems` are the CLI's one-line messages; anything
else that goes wrong is one line too, its traceback only in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import tempfile
import time
import traceback
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import SetupError
from . import page
from .answers import Answer, Answers, Waiting
from .inputs import BOUNDS, add_upload
from .lookup import Lookups
from .workers import SIMULATE_TIMEOUT, Workers, _problems

QUICK_TIMEOUT = 60.0
"""Seconds the server waits for a request's work in its threads (a plan's validation, an upload, a report)."""
FIRST_WAIT = 1.0
"""Seconds an answer waits for a hub id's lookup or a new setup's first answer before it says what is being
done instead (the page asks again 0.8 s later): no request is held longer, and none holds another."""
MAX_ROWS_BYTES = 8 * 2**20
"""Largest JSONL accepted for the measured-result view (a 300-point sweep is about 1 MiB)."""
REPORTS = 16
"""Measured-result reports kept in memory."""
PAGE_POLICY = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-src 'self'; "
               "object-src 'none'; base-uri 'none'; form-action 'none'")
REPORT_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
"""A report page is `trainmem report`'s self-contained HTML: inline styles, inlined PNGs, one inline script."""
log = logging.getLogger("trainmem.serve")


class Problems(Exception):
    """A request's problems, each one line, with the HTTP status to answer."""

    def __init__(self, lines: list[str], status: int = 422):
        super().__init__("; ".join(lines))
        self.lines, self.status = lines, status


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers={"Cache-Control": "no-store"})


def create_app(processes: int = 2, warm: bool = True, simulate_timeout: float = SIMULATE_TIMEOUT,
               probe: Callable[[str], str | None] | None = None) -> Starlette:
    """The app; `processes` worker processes simulate and plan; `warm` answers the page's first setup at
    start-up (its simulations start the workers), so the first visitor finds it ready; `simulate_timeout`
    bounds a runtime group's simulation (seconds); `probe(endpoint)` says why the Hub cannot be reached
    (`lookup.unreachable`; tests pass their own)."""
    threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="trainmem-serve")
    reports: OrderedDict[str, str] = OrderedDict()
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["workers"] = Workers(processes)
        state["answers"] = Answers(state["workers"], simulate_timeout, Lookups(probe))
        if warm:  # the page's first setup, answered before anyone asks (its simulations start the workers)
            threads.submit(_quietly, lambda: state["answers"].estimate(state["answers"].query({})))
        yield
        state["answers"].close()
        state["workers"].close()
        threads.shutdown(wait=False, cancel_futures=True)

    async def off_loop(fn: Callable[[], Any], timeout: float = QUICK_TIMEOUT) -> Any:
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(threads, fn), timeout)
        except asyncio.TimeoutError:
            raise Problems([f"the server took more than {timeout:.0f} s on this request and stopped waiting; "
                            "try again in a moment (a new model is fetched and counted once)"], 503) from None

    def query(form: dict[str, str]) -> Any:
        return state["answers"].query(form)

    async def answer_of(form: dict[str, str]) -> Answer | Waiting:
        """`Answers.ask` in the event loop (a cached answer is computed at once, under no lock), waiting up
        to `FIRST_WAIT` for a lookup or a first answer before saying what is being done."""
        loop = asyncio.get_running_loop()
        end = loop.time() + FIRST_WAIT
        while True:
            found = state["answers"].ask(form)
            if not isinstance(found, Waiting) or loop.time() >= end:
                return found
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(found.future)), end - loop.time())
            except asyncio.TimeoutError:
                return found
            except Exception:  # noqa: BLE001 (the next ask raises it, as the request's answer)
                pass

    async def home(request: Request) -> Response:
        return HTMLResponse(page.page(), headers={"Content-Security-Policy": PAGE_POLICY})

    async def estimate(request: Request) -> Response:
        answer = await answer_of(dict(request.query_params))
        if isinstance(answer, Waiting):
            return _json({"pending": True, "waiting": answer.what, "problems": [],
                          "html": {"status": page.waiting(answer.what)}})
        s = answer.query.setup
        return _json({"pending": answer.pending, "groups": answer.groups, "problems": answer.problems,
                      "card": answer.query.card, "batch_size": s.batch_size, "ranks": s.gpus,
                      "timed_out": answer.timed_out,
                      "html": {"cards": page.cards_table(answer), "breakdown": page.breakdown(answer),
                               "status": page.status(answer)},
                      "rows": [_row(r) for r in answer.rows]})

    async def retry(request: Request) -> Response:
        q = state["answers"].known(dict(request.query_params))
        if q is None:
            raise Problems(["retry: this setup has not been answered here yet; ask for it first"], 409)
        return _json({"retried": state["answers"].retry(q)})

    async def result(request: Request) -> Response:
        answer = await answer_of(dict(request.query_params))
        if isinstance(answer, Waiting):
            raise Problems([f"the server is still {answer.what}; download again in a moment"], 503)
        chosen = answer.chosen
        body = {"model": answer.query.model, "card": answer.query.card, "setup": answer.query.setup.to_dict(),
                "pending": answer.pending, "cards": [_row(r) for r in answer.rows],
                "result": (chosen.answer.to_result(chosen.card.name).to_dict()
                           if not isinstance(chosen.answer, (list, type(None))) else None)}
        q = answer.query
        name = f"trainmem-{q.spec.name.replace('/', '_')}-b{q.setup.batch_size}-{q.card}.json"
        return Response(json.dumps(body, indent=1), media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    async def config(request: Request) -> Response:
        sent = await _body(request, 2 * 2**20)
        model = await off_loop(lambda: add_upload(str(sent.get("name", "config.json")), str(sent.get("text", ""))))
        return _json({"model": model})

    async def plan(request: Request) -> Response:
        form = dict(request.query_params)
        allow = tuple(a for a in request.query_params.getlist("allow") if a)
        q = await off_loop(lambda: query(form))
        problems = [p for p in _plan_problems(form.get("target", ""), allow)]
        if problems:
            raise Problems(problems)
        found = state["answers"].plan(q, int(form["target"]), allow)
        if found is None:
            return _json({"pending": True})
        if found[0] != "ok":
            raise Problems(found[1])
        return _json({"pending": False, "html": page.plan(found[1]), "plan": found[1]})

    async def report(request: Request) -> Response:
        sent = await _body(request, MAX_ROWS_BYTES + 4096)
        text = str(sent.get("text", ""))
        html, timeline = await off_loop(lambda: _report(text, sent.get("gpu"), str(sent.get("name", ""))), timeout=120)
        key = secrets.token_urlsafe(12)
        reports[key] = html
        while len(reports) > REPORTS:
            reports.popitem(last=False)
        return _json({"url": f"/report/{key}", "timeline": timeline})

    async def stored_report(request: Request) -> Response:
        html = reports.get(request.path_params["key"])
        if html is None:
            return HTMLResponse("<p>This report is no longer kept here: upload the file again.</p>", 404)
        return HTMLResponse(html, headers={"Content-Security-Policy": REPORT_POLICY})

    async def health(request: Request) -> Response:
        return _json({"ok": True})

    routes = [Route("/", home), Route("/api/estimate", estimate), Route("/api/result.json", result),
              Route("/api/config", config, methods=["POST"]), Route("/api/plan", plan),
              Route("/api/retry", retry, methods=["POST"]),
              Route("/api/report", report, methods=["POST"]), Route("/report/{key}", stored_report),
              Route("/healthz", health),
              Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static")]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={Problems: _answer_problems, SetupError: _answer_problems,
                                        Exception: _answer_error})
    app.state.serve = state
    return app


def _row(r: Any) -> dict[str, Any]:
    """A card's row as data: the verdict (or the problems), the largest micro-batch, the time, the method."""
    out: dict[str, Any] = {"card": r.card.name, "capacity": r.card.capacity, "method": r.method,
                           "max_batch": r.max_batch, "smallest_that_fits": r.smallest, "stopped": r.stopped}
    if isinstance(r.answer, list):
        out["problems"] = r.answer
    elif r.answer is not None:
        v = r.answer.verdict(r.card)
        out.update(level=v["level"], headroom=v["headroom"], need=v["need"], time=r.answer.time)
    return out


def _plan_problems(target: str, allow: tuple[str, ...]) -> list[str]:
    from trainmem.search.plan import DIMENSIONS

    out = []
    if not target.isdigit() or not 1 <= int(target) <= BOUNDS["target"]:
        out.append(f"--target-batch: expected a whole number from 1 to {BOUNDS['target']}, got {target[:20]!r}")
    unknown = [a for a in allow if a not in DIMENSIONS]
    if unknown:
        out.append(f"--allow: {', '.join(map(repr, unknown))} not among {', '.join(DIMENSIONS)}")
    return out


async def _body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read up to `limit` bytes (a larger body is refused before it is read)."""
    if int(request.headers.get("content-length") or 0) > limit:
        raise Problems([f"upload: more than {limit:,} bytes; trainmem serve takes files up to that size"], 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problems([f"upload: more than {limit:,} bytes; trainmem serve takes files up to that size"], 413)
        chunks.append(chunk)
    try:
        sent = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        raise Problems(["upload: the request is not JSON ({name, text})"]) from None
    if not isinstance(sent, dict):
        raise Problems(["upload: the request is not a JSON object ({name, text})"])
    return sent


def _report(text: str, gpu: Any, name: str = "") -> tuple[str, str]:
    """`trainmem report` on the uploaded rows, in a temporary folder: its HTML page and the phase timeline."""
    import re

    from trainmem.output.report import write_report

    from .. import find_gpu, read_rows

    if len(text.encode()) > MAX_ROWS_BYTES:
        raise Problems([f"FILE.jsonl: more than {MAX_ROWS_BYTES:,} bytes"], 413)
    card = find_gpu(gpu).name if isinstance(gpu, str) and find_gpu(gpu) else None
    with tempfile.TemporaryDirectory(prefix="trainmem-serve-") as tmp:
        source = Path(tmp) / (re.sub(r"[^\w.-]", "_", Path(name).name)[:80].lstrip(".") or "rows.jsonl")
        source.write_text(text, encoding="utf-8")
        rows = read_rows(source)
        if not rows:
            raise Problems(["FILE.jsonl: no trainmem result rows (one JSON object per line, schema "
                            "trainmem.result/1): pass the --out file of trainmem run, sweep or estimate"])
        try:
            written = write_report(source, Path(tmp) / "report", card)
        except (ValueError, KeyError, TypeError) as e:
            raise Problems([f"FILE.jsonl: {type(e).__name__}: {e}"[:300]]) from None
        return written["html"].read_text(encoding="utf-8"), page.timeline(rows)


async def _answer_problems(request: Request, exc: Exception) -> Response:
    if isinstance(exc, SetupError):
        return _json({"problems": exc.problems}, 422)
    return _json({"problems": exc.lines}, exc.status)  # type: ignore[attr-defined]


async def _answer_error(request: Request, exc: Exception) -> Response:
    log.error("trainmem serve: %s %s failed\n%s", request.method, request.url.path, traceback.format_exc())
    return _json({"problems": _problems(exc)}, 500)


def _quietly(fn: Callable[[], Any]) -> None:
    """Run a warm-up; a failure there is logged, never raised into the server."""
    start = time.monotonic()
    try:
        fn()
        log.info("trainmem serve: warm in %.1f s", time.monotonic() - start)
    except Exception:  # noqa: BLE001
        log.warning("trainmem serve: warm-up failed\n%s", traceback.format_exc())


__all__ = ["create_app", "QUICK_TIMEOUT", "MAX_ROWS_BYTES"]
