"""The blocking client of corrald (see the package docstring)."""

from __future__ import annotations

import json
import select
import socket as _socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

from . import _calls
from ._calls import RESUME_EVERY, RESUME_FOR, Again, Call, Collector, Resume  # noqa: F401 (RESUME_*: re-exported)
from ._wire import (
    ConnectionClosed,
    CorralError,
    Data,
    EndEvent,
    Event,
    FollowCursor,
    Info,
    Output,
    OutputEvent,
    Record,
    Result,
    default_socket,
    encode_request,
    note_event,
    rpc_error,
)


class _Conn:
    """One connection to corrald: newline-delimited JSON-RPC requests out,
    responses and notifications in. Not safe for concurrent use; Client
    serialises its calls with a lock."""

    def __init__(self, path: str, timeout: Optional[float]):
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.settimeout(timeout if timeout is not None else 10.0)
            s.connect(path)
            s.settimeout(timeout)
        except OSError as e:
            s.close()
            raise ConnectionClosed(f"connect to corrald at {path}: {e} (is corrald running? CORRAL_SOCKET names its socket)") from e
        self.sock = s
        self.rfile = s.makefile("rb")
        self.next_id = 0

    def send(self, method: str, params: Any) -> int:
        self.next_id += 1
        line = encode_request(self.next_id, method, params)
        try:
            self.sock.sendall(line)
        except OSError as e:
            raise ConnectionClosed(f"{method}: send to corrald: {e}") from e
        return self.next_id

    def read(self) -> Dict[str, Any]:
        """The next message from corrald; ConnectionClosed at the end."""
        while True:
            try:
                line = self.rfile.readline()
            except OSError as e:
                raise ConnectionClosed(f"read from corrald: {e}") from e
            if not line:
                raise ConnectionClosed("corrald closed the connection")
            line = line.strip()
            if line:
                return json.loads(line)

    def stale(self) -> bool:
        """corrald has closed this connection (a restart or handover while
        it sat idle): nothing was sent on it that could be lost."""
        r, _, _ = select.select([self.sock], [], [], 0)
        if not r:
            return False
        try:
            return self.sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        try:
            self.rfile.close()
        finally:
            self.sock.close()


def _result(method: str, msg: Dict[str, Any]) -> Any:
    err = msg.get("error")
    if err is not None:
        raise rpc_error(err)
    return msg.get("result")


class Client:
    """A connection to corrald at socket (default $CORRAL_SOCKET, else
    /run/corral/corrald.sock).

    Methods map one to one to the protocol's (docs/protocol.md) and return
    dataclasses; an error answered by corrald raises CorralError with its
    code. Safe for use from several threads (calls take turns on the
    connection); follow() uses a connection of its own. timeout, when set,
    bounds each call in seconds (leave it None for wait and long output
    waits).

    corrald reloading (SIGHUP, a handover) or restarting ends connections,
    not executions. A connection corrald closed while it was idle is
    replaced before the next call. The calls that wait, and only read, go
    on across one: wait(), output() with wait_ms and follow() dial again
    (every RESUME_EVERY s, for up to RESUME_FOR = 15 s, as corralctl run,
    wait and logs -f do), log a warning "connection to corrald lost
    (restart or reload?); reconnected, waiting for ID on" on the "corral"
    logger, and ask again (wait and output with what is left of timeout_ms
    or wait_ms; follow from the last byte it yielded). A corrald that does
    not come back within the window raises ConnectionClosed ("...; not
    reconnected: for 15s: ..."). Every other call is sent once: when its
    connection breaks during the call it raises ConnectionClosed, the call
    may or may not have been done, and the next call dials again. Repeat
    get, list, info or output yourself if you like; do not repeat a start
    without an id (it may have started: list by label, or pass id=, an
    idempotency key, so that the repeat returns the same execution), nor a
    write (the bytes may have been written) or signal. call() is always
    sent once."""

    def __init__(self, socket: Optional[str] = None, timeout: Optional[float] = None):
        self.socket = socket or default_socket()
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: Optional[_Conn] = _Conn(self.socket, timeout)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: str, params: Any = None) -> Any:
        """Sends one request and returns its raw result (a dict)."""
        with self._lock:
            if self._conn is not None and self._conn.stale():
                self._conn.close()
                self._conn = None
            if self._conn is None:
                self._conn = _Conn(self.socket, self.timeout)
            conn = self._conn
            try:
                rid = conn.send(method, params)
                while True:
                    msg = conn.read()
                    if msg.get("id") == rid:
                        return _result(method, msg)
                    if msg.get("id") is None and msg.get("error"):
                        # corrald's last word before it closes the connection
                        # (a line over the limit, a parse error).
                        conn.close()
                        self._conn = None
                        return _result(method, msg)
            except (ConnectionClosed, OSError) as e:
                conn.close()
                self._conn = None
                if isinstance(e, ConnectionClosed):
                    raise
                raise ConnectionClosed(f"{method}: {e}") from e

    # The protocol's methods: _calls builds each one's params and parses
    # its result.

    def _do(self, c: Call) -> Any:
        return c.parse(self.call(c.method, c.params))

    def start(self, argv, **kw) -> Record:
        """exec.start: runs argv; keyword arguments are the protocol's fields
        (env, cwd, stdin, stdin_open, timeout_ms, grace_ms, cpu_ms,
        memory_bytes, tasks_max, output_limit_bytes, labels, id, user,
        network, redact, tty, tty_size, idle_timeout_ms, traceparent — a W3C
        trace context that makes the execution's trace a child of the
        caller's). A command that cannot be executed is a record with outcome
        "start_failed"."""
        return self._do(_calls.start(argv, **kw))

    def get(self, id: str) -> Record:
        return self._do(_calls.get(id))

    def wait(self, id: str, timeout_ms: Optional[int] = None) -> Record:
        """exec.wait: the record once cleaned, or the current one when
        timeout_ms passes first. Goes on across a corrald reload or restart
        (see the class docstring)."""
        return self._again(Again(lambda ms: _calls.wait(id, ms), timeout_ms, id, f"waiting for {id}", time.monotonic))

    def _again(self, a: Again) -> Any:
        """Sends a's call; when its connection breaks, dials corrald again
        for up to RESUME_FOR seconds and sends it again."""
        while True:
            try:
                return self._do(a.call())
            except (ConnectionClosed, CorralError) as e:
                if not a.retryable(e):
                    raise
                a.dropped(e)
            while True:
                time.sleep(RESUME_EVERY)
                try:
                    conn = _Conn(self.socket, self.timeout)
                    break
                except ConnectionClosed as e:
                    a.dial_failed(e)
            with self._lock:
                if self._conn is None:
                    self._conn, conn = conn, None
            if conn is not None:
                conn.close()  # another call dialled first: use its connection
            a.reconnected()

    def cancel(self, id: str, reason: Optional[str] = None) -> Record:
        return self._do(_calls.cancel(id, reason))

    def signal(self, id: str, signal: str, target: Optional[str] = None) -> Record:
        """exec.signal: signal is a name ("SIGINT"); target "all" (default)
        or "main"."""
        return self._do(_calls.signal(id, signal, target))

    def write(self, id: str, data: Data = b"", close: bool = False) -> int:
        """exec.write: writes data (bytes or str) to stdin; returns the
        number of bytes written."""
        return self._do(_calls.write(id, data, close))

    def resize(self, id: str, rows: int, cols: int) -> Record:
        return self._do(_calls.resize(id, rows, cols))

    def update(self, id: str, timeout_ms: int) -> Record:
        """exec.update: a new wall-clock deadline, timeout_ms from now."""
        return self._do(_calls.update(id, timeout_ms))

    def list(self, state: Optional[str] = None, labels: Optional[Dict[str, str]] = None,
             limit: Optional[int] = None) -> List[Record]:
        return self._do(_calls.list(state, labels, limit))

    def output(self, id: str, stream: str = "stdout", offset: int = 0, limit: Optional[int] = None,
               wait_ms: Optional[int] = None) -> Output:
        """exec.output: kept bytes of stream from offset; with wait_ms, waits
        for some when there are none yet (and then goes on across a corrald
        reload or restart, see the class docstring)."""
        if wait_ms is None:
            return self._do(_calls.output(id, stream, offset, limit))
        return self._again(Again(lambda ms: _calls.output(id, stream, offset, limit, ms), wait_ms, id,
                                 f"waiting for {id}'s {stream}", time.monotonic))

    def info(self) -> Info:
        return self._do(_calls.info())

    def follow(self, id: str, stdout_offset: int = 0, stderr_offset: int = 0, heartbeat_ms: Optional[int] = None,
               resume: bool = True) -> Iterator[Event]:
        """exec.follow as an iterator of OutputEvent, StateEvent and
        HeartbeatEvent, ending with an EndEvent that holds the final record.

        It runs on a connection of its own. When that connection drops (a
        corrald restart, a network namespace hiccup) and resume is true, it
        reconnects for up to RESUME_FOR seconds and follows on from the last
        byte it yielded: no byte is lost or repeated. Chunks corrald skipped
        for a slow reader are read back with exec.output."""
        cursor = FollowCursor(stdout_offset, stderr_offset)
        budget = Resume(self.socket, time.monotonic, id)
        while True:
            try:
                conn = _Conn(self.socket, None)
            except OSError as e:
                budget.connect_failed(resume, e)
                time.sleep(RESUME_EVERY)
                continue
            budget.connected()
            try:
                rid = conn.send("exec.follow", cursor.params(id, heartbeat_ms))
                while True:
                    msg = conn.read()
                    if msg.get("id") == rid:
                        rec = _calls.follow_end(msg, resume)
                        # Anything corrald skipped at the very end.
                        for s, info in (("stdout", rec.stdout), ("stderr", rec.stderr)):
                            if info is not None:
                                yield from self._fill(id, cursor, s, info.total_bytes)
                        yield EndEvent(rec)
                        return
                    if msg.get("method") is None:
                        continue
                    ev = note_event(msg["method"], msg.get("params") or {})
                    if ev is None:
                        continue
                    if isinstance(ev, OutputEvent):
                        yield from self._fill(id, cursor, ev.stream, ev.offset)
                        ev = cursor.take(ev)
                        if ev is None:
                            continue
                    budget.delivered()
                    yield ev
            except (ConnectionClosed, OSError) as e:
                if not resume:
                    raise
                budget.dropped(e)
                time.sleep(RESUME_EVERY)
            finally:
                conn.close()

    def _fill(self, id: str, cursor: FollowCursor, stream: str, upto: int) -> Iterator[OutputEvent]:
        """Reads stream from the cursor up to offset upto with exec.output:
        the bytes a follow did not deliver."""
        while True:
            c = _calls.fill(id, cursor, stream, upto)
            if c is None:
                return
            ev = _calls.filled(id, cursor, stream, self._do(c))
            if ev is None:
                return
            yield ev

    def run(self, argv, **kw) -> Result:
        """Runs argv to the end (start, then follow) and returns the final
        record with all of stdout and stderr as bytes. Keyword arguments are
        start()'s."""
        col = Collector(self.start(argv, **kw))
        for ev in self.follow(col.rec.id):
            col.add(ev)
        return col.result()


def run(argv, socket: Optional[str] = None, **kw) -> Result:
    """corral.run(["make", "test"], timeout_ms=600000): runs argv under
    corrald on a connection of its own and returns its Result."""
    with Client(socket) as c:
        return c.run(argv, **kw)
