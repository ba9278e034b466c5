"""The daemon process's life (`spotbag serve`): claim the state directory, listen, load,
serve, stop.

Listen first, then load (issue 24). Importing the scheduler, numpy and scipy and
recovering the store takes seconds, and longer on a busy machine; a daemon that bound its
port only afterwards looked dead to everything that waited for it. So `serve` binds the
API's socket as soon as the state directory is locked, writes STATE_DIR/api.url, and
answers every request at once while the rest loads on a worker thread:

- `GET /healthz`: 503 `{"ok": false, "status": "starting", "driver"}`;
- any other path: 503 `{"error": {"code": "starting", ...}}` (a browser asking for a
  page gets one that reloads itself);

each with `Retry-After: 1` and the connection closed, so that the client's next request
reaches the full API. The readiness rule (docs/operations.md#healthz): the daemon is
ready when `GET /healthz` answers 200 with `"status": "ok"`; that is when its scheduler
runs, and when systemd gets READY=1 (Type=notify). Until then nothing has been read or
changed, so any request may simply be sent again.

On SIGTERM or SIGINT it stops cleanly, also while still starting: no new requests,
running local jobs stopped and recorded as lost (they run again on the next start),
database closed, api.url removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import importlib
import logging
import os
import resource
import signal
import sys
import warnings
from collections.abc import Awaitable
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

from aiohttp import web

from controller.api.limits import ConnectionGate, quiet_accept_errors
from controller.config import Config, ConfigError
from controller.errors import SpotbagError
from controller.plumbing.sdnotify import notify
from policies.connections import connection_cap

if TYPE_CHECKING:
    from controller.daemon import Controller

log = logging.getLogger("spotbag.daemon")

SWITCH_INTERVAL_S = 0.001  # the GIL's time slice (sys.setswitchinterval) in the daemon
# The API's listening socket: the kernel queues up to LISTEN_BACKLOG connections (capped
# by net.core.somaxconn) until they are accepted, ACCEPT_BATCH at a time. asyncio takes
# one number for both; they differ on purpose (`_listen`).
LISTEN_BACKLOG = 1024
ACCEPT_BATCH = 64
STARTING_RETRY_AFTER_S = 1  # what a request answered while starting is told to wait
START_EXTEND_INTERVAL_S = 10.0
PRIVATE_FILES = ("token", "spotbag.db", "spotbag.db-wal", "spotbag.db-shm", "slurm-hook.secret")


class StateDirBusy(SpotbagError, RuntimeError):
    pass


class TaskDied(SpotbagError, RuntimeError):
    """A task the daemon cannot live without ended: exit non-zero, to be restarted."""


async def serve(
    config: Config, *, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run the daemon until SIGTERM/SIGINT (or `stop` is set); `ready` is set when it is."""
    # The event loop's thread shares the GIL with the store's writer and the threads
    # that expand bags (and, while starting, the one that imports the daemon): each time
    # it comes back from I/O it waits for a busy thread's time slice to end (5 ms by
    # default, several times per request). 1 ms keeps a request's waits short while a
    # big bag is written (issue 14).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _watch_children_with_pidfds()
    connections = _connection_cap(config)  # a limit too low is refused before anything starts
    state_dir = config.resolved_state_dir()
    lock_file = claim_state_dir(state_dir)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    keepalive = asyncio.create_task(_keep_systemd_waiting(), name="start-keepalive")
    api = config.api
    starting = web.Server(
        _starting_answer(config.driver.name),
        access_log=None,
        keepalive_timeout=api.header_timeout_s,
    )
    controller: Controller | None = None

    def count_refusal(reason: str) -> None:
        if controller is not None:  # refusals while starting are only logged
            controller.metrics.http_connections_refused.labels(reason=reason).inc()

    # Connections pass the caps before aiohttp sees them (controller/api/limits.py):
    # the listening socket is ours; aiohttp's web.Server is its protocol factory, the
    # start-up answers' first, the API's once loaded.
    gate = ConnectionGate(
        starting, cap=connections, per_client=api.max_connections_per_client, count=count_refusal
    )
    quiet_accept_errors(loop)
    listening: asyncio.Server | None = None
    runner: web.AppRunner | None = None
    died: TaskDied | None = None
    try:
        listening = await _listen(gate, api.host, api.port)
        host, port = listening.sockets[0].getsockname()[:2]
        url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        write_url_file(state_dir, url)
        log.info("listening on %s; loading (GET /healthz says starting until ready)", url)

        async def load() -> None:
            nonlocal controller
            # On a worker thread: the event loop answers meanwhile.
            daemon = await asyncio.to_thread(_import_the_daemon)
            controller = daemon.Controller(config)
            await controller.start()

        loading = asyncio.create_task(load(), name="start")
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            log.info("stopping while starting")
            loading.cancel()
            await logged_step("stopping the start", loading)
            return
        stopping.cancel()
        loading.result()  # what start raised (a configuration it cannot use, ...)
        assert controller is not None
        runner = await _api_runner(controller)
        assert runner.server is not None
        gate.serve_with(runner.server)
        controller.metrics.http_connections_open.set_function(lambda: gate.open_connections)
        log.info(
            "HTTP limits: at most %d connections (%d from one client), a request's headers "
            "within %g s, its body within %g s",
            connections,
            min(connections, api.max_connections_per_client),
            api.header_timeout_s,
            api.body_timeout_s,
        )
        keepalive.cancel()
        # What start-up made (modules, schemas, routes, the recovered state) lives as
        # long as the daemon: out of the collector's generations, it is not walked by
        # every full collection (~50,000 objects, tens of ms of the event loop each
        # time, and full collections come every second or two while a big bag is
        # cancelled; issue 14). Objects still die by reference counting.
        gc.collect()
        gc.freeze()
        log.info("spotbag serving %s (driver %s, state %s)", url, controller.driver.name, state_dir)
        if ready is not None:
            ready.set()
        await notify(READY="1", STATUS=f"serving {url} (driver {controller.driver.name})")
        died = await _serve_until_stopped(controller, stop)
        log.info("stopping")
        await notify(STOPPING="1", STATUS="stopping: ending running jobs")
    finally:
        keepalive.cancel()
        if listening is not None:
            listening.close()  # no new connections; aiohttp ends the open ones
        await logged_step("closing the start-up answers", starting.shutdown(1.0))
        if runner is not None:
            await logged_step("closing the API", runner.cleanup())
        if controller is not None:
            await controller.stop()
        with contextlib.suppress(FileNotFoundError):
            (state_dir / "api.url").unlink()
        lock_file.close()
        log.info("stopped")
    if died is not None:
        raise died


async def _serve_until_stopped(controller: Controller, stop: asyncio.Event) -> TaskDied | None:
    """Until `stop` is set, or a task the daemon cannot live without ends (then that)."""
    stopping = asyncio.ensure_future(stop.wait())
    critical = controller.critical_tasks()
    await asyncio.wait([stopping, *critical], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    dead = [t for t in critical if t.done()]
    if dead and not stop.is_set():
        # Half alive (serving, but nothing runs) is worse than down: systemd
        # (Restart=on-failure) starts a fresh daemon, which recovers from the store.
        why = "; ".join(_how_it_ended(t) for t in dead)
        log.error("stopping: %s", why)
        return TaskDied(why)
    return None


def _import_the_daemon() -> ModuleType:
    """The modules of the running daemon: numpy, scipy, the scheduler, the store, the API."""
    importlib.import_module("controller.api.app")
    importlib.import_module("scipy.special")  # the deadline policy's, imported where used
    return importlib.import_module("controller.daemon")


async def _api_runner(controller: Controller) -> web.AppRunner:
    """The full API's aiohttp runner, set up (not listening: the gate hands it connections)."""
    from controller.api.app import build_app, server_logger
    from controller.api.jobs import MAX_REQUEST_LINE_BYTES

    runner = web.AppRunner(
        build_app(controller),
        access_log=None,
        handle_signals=False,
        logger=server_logger(),
        max_line_size=MAX_REQUEST_LINE_BYTES,
        # Also the deadline of a new connection's request line and headers (aiohttp's
        # keep-alive timer starts when the connection is made): slow clients let go.
        keepalive_timeout=controller.config.api.header_timeout_s,
    )
    await runner.setup()
    return runner


STARTING_PAGE = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    '<meta http-equiv="refresh" content="1"><title>spotbag: starting</title></head>'
    "<body><p>spotbag is starting; this page reloads itself.</p></body></html>"
)
STARTING_MESSAGE = (
    "the daemon is starting (loading, opening its database, recovering its work); "
    "nothing was changed: send the request again in a moment (GET /healthz says when "
    "it is ready)"
)


def _starting_answer(driver: str) -> Any:
    """The handler of every request while the daemon starts (the module docstring)."""
    headers = {"Retry-After": str(STARTING_RETRY_AFTER_S)}

    async def answer(request: web.BaseRequest) -> web.Response:
        if request.path == "/healthz":
            body: dict[str, Any] = {"ok": False, "status": "starting", "driver": driver}
            response = web.json_response(body, status=503, headers=headers)
        elif _wants_page(request):
            response = web.Response(
                text=STARTING_PAGE, status=503, content_type="text/html", headers=headers
            )
        else:
            error = {"code": "starting", "message": STARTING_MESSAGE, "detail": {}}
            response = web.json_response({"error": error}, status=503, headers=headers)
        # The next request comes on a new connection, which the full API takes once ready.
        response.force_close()
        return response

    return answer


def _wants_page(request: web.BaseRequest) -> bool:
    """A browser asking for one of the web UI's pages (not the API, not a file)."""
    api = request.path.startswith("/v1/") or request.path in ("/metrics", "/openapi.json")
    return not api and "text/html" in request.headers.get("Accept", "")


# --- the state directory ----------------------------------------------------------------


def claim_state_dir(state_dir: Path) -> IO[str]:
    """Make the state directory (private) and hold its lock until the returned file is
    closed: two daemons on one database would corrupt each other's view. Raises
    StateDirBusy when another daemon holds it."""
    # What the daemon (and its local jobs) create is private to its user: the
    # database holds bag specs with their env values and the ledger, logs hold
    # whatever jobs print.
    os.umask(0o077)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / "lock"
    lock_file = path.open("a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "?"
        lock_file.close()
        raise StateDirBusy(f"another spotbag daemon (pid {holder}) is using {state_dir}") from None
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(str(os.getpid()))
    lock_file.flush()
    _make_private(state_dir)
    return lock_file


def _make_private(state_dir: Path) -> None:
    """Close a state directory (and its secrets) that an older version, or an operator,
    left readable by others."""
    mode = state_dir.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("state directory %s was mode %o; making it 0700", state_dir, mode)
        state_dir.chmod(0o700)
    for name in PRIVATE_FILES:
        path = state_dir / name
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)


def write_url_file(state_dir: Path, url: str) -> None:
    tmp = state_dir / "api.url.tmp"
    tmp.write_text(url + "\n")
    tmp.replace(state_dir / "api.url")


# --- the listening socket -----------------------------------------------------------------


async def _listen(factory: Any, host: str, port: int) -> asyncio.Server:
    """The API's listening sockets, with a long kernel queue but short accept batches.

    asyncio accepts up to its `backlog` connections each time the socket is readable,
    and the connection caps see them only afterwards: every one of a batch holds a
    descriptor meanwhile, so the batch is kept short (the descriptors beyond the cap stay
    few). The kernel's queue must stay long: when it is full, new connections' SYNs are
    dropped and their clients retry only a second later (a /healthz probe took 1.01 s
    under a flood). Calling listen() again on a listening socket only changes its queue."""
    server = await asyncio.get_running_loop().create_server(
        factory, host, port, backlog=ACCEPT_BATCH
    )
    for sock in server.sockets:
        with sock.dup() as same:  # the same socket; asyncio's wrapper has no listen()
            same.listen(LISTEN_BACKLOG)
    return server


def _connection_cap(config: Config) -> int:
    """The most HTTP connections the daemon holds: [api] max_connections, lowered so
    that [api] reserved_fds descriptors stay free for its own work (the database, job
    logs and processes, Slurm commands, cloud sessions) under RLIMIT_NOFILE."""
    nofile_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if nofile_soft == resource.RLIM_INFINITY:
        return config.api.max_connections
    try:
        return connection_cap(config.api.max_connections, nofile_soft, config.api.reserved_fds)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# --- the process ------------------------------------------------------------------------


def _watch_children_with_pidfds() -> None:
    """Python 3.11 waits for each subprocess (every Slurm command) on a thread of its own;
    where the kernel has pidfds, watch them on the event loop instead (3.12's default)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # no pidfds here (an old kernel, a sandbox): keep the threads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)


async def _keep_systemd_waiting() -> None:
    """While the daemon loads, opens its store and recovers, ask systemd (Type=notify)
    for more time, again and again: a recovery that makes progress is never killed by
    TimeoutStartSec, and one that hangs (no message for 3 intervals) still is."""
    extend_usec = int(3 * START_EXTEND_INTERVAL_S * 1e6)
    while True:
        await notify(
            STATUS="starting: opening the store, recovering bags, VMs and the ledger",
            EXTEND_TIMEOUT_USEC=str(extend_usec),
        )
        await asyncio.sleep(START_EXTEND_INTERVAL_S)


async def logged_step(what: str, awaitable: Awaitable[Any]) -> None:
    """Await one step of stopping; log its failure and go on to the next."""
    try:
        await awaitable
    except asyncio.CancelledError:
        pass  # the task we cancelled
    except Exception:
        log.exception("%s failed", what)


def _how_it_ended(task: asyncio.Task) -> str:
    if task.cancelled():
        return f"task {task.get_name()} was cancelled"
    error = task.exception()
    if error is None:
        return f"task {task.get_name()} ended"
    return f"task {task.get_name()} failed: {type(error).__name__}: {error}"
