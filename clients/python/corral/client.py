"""The blocking client of corrald (see the package docstring)."""

from __future__ import annotations

import json
import select
import socket as _socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

from ._wire import (
    MAX_LINE_BYTES,
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
    drop_none,
    encode_data,
    note_event,
    start_params,
)

#: How long follow() keeps trying to reconnect after its connection drops
#: (a corrald restart or handover takes a second or two).
RESUME_FOR = 15.0
RESUME_EVERY = 0.1


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
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        if len(line) > MAX_LINE_BYTES:
            raise CorralError(-32600, f"{method}: request is {len(line)} bytes, over corrald's {MAX_LINE_BYTES}-byte line limit")
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
        raise CorralError(int(err.get("code", -32603)), str(err.get("message", "")), err.get("data"))
    return msg.get("result")


class Client:
    """A connection to corrald at socket (default $CORRAL_SOCKET, else
    /run/corral/corrald.sock).

    Methods map one to one to the protocol's (docs/protocol.md) and return
    dataclasses; an error answered by corrald raises CorralError with its
    code. Safe for use from several threads (calls take turns on the
    connection); follow() uses a connection of its own. A connection corrald
    closed while it was idle (a restart, a handover) is replaced before the
    next call; one that breaks during a call raises ConnectionClosed (the
    call may or may not have been done) and the next call dials again. timeout, when set,
    bounds each call in seconds (leave it None for wait and long output
    waits)."""

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

    # The protocol's methods.

    def start(self, argv, **kw) -> Record:
        """exec.start: runs argv; keyword arguments are the protocol's fields
        (env, cwd, stdin, stdin_open, timeout_ms, grace_ms, cpu_ms,
        memory_bytes, tasks_max, output_limit_bytes, labels, id, user,
        network, redact, tty, tty_size, idle_timeout_ms, traceparent — a W3C
        trace context that makes the execution's trace a child of the
        caller's). A command that cannot be executed is a record with outcome
        "start_failed"."""
        return Record.from_dict(self.call("exec.start", start_params(argv, **kw)))

    def get(self, id: str) -> Record:
        return Record.from_dict(self.call("exec.get", {"id": id}))

    def wait(self, id: str, timeout_ms: Optional[int] = None) -> Record:
        """exec.wait: the record once cleaned, or the current one when
        timeout_ms passes first."""
        return Record.from_dict(self.call("exec.wait", drop_none(id=id, timeout_ms=timeout_ms)))

    def cancel(self, id: str, reason: Optional[str] = None) -> Record:
        return Record.from_dict(self.call("exec.cancel", drop_none(id=id, reason=reason)))

    def signal(self, id: str, signal: str, target: Optional[str] = None) -> Record:
        """exec.signal: signal is a name ("SIGINT"); target "all" (default)
        or "main"."""
        return Record.from_dict(self.call("exec.signal", drop_none(id=id, signal=signal, target=target)))

    def write(self, id: str, data: Data = b"", close: bool = False) -> int:
        """exec.write: writes data (bytes or str) to stdin; returns the
        number of bytes written."""
        p: Dict[str, Any] = {"id": id}
        if data:
            p["data"] = encode_data(data)
        if close:
            p["close"] = True
        return int(self.call("exec.write", p).get("written", 0))

    def resize(self, id: str, rows: int, cols: int) -> Record:
        return Record.from_dict(self.call("exec.resize", {"id": id, "rows": rows, "cols": cols}))

    def update(self, id: str, timeout_ms: int) -> Record:
        """exec.update: a new wall-clock deadline, timeout_ms from now."""
        return Record.from_dict(self.call("exec.update", {"id": id, "timeout_ms": timeout_ms}))

    def list(self, state: Optional[str] = None, labels: Optional[Dict[str, str]] = None,
             limit: Optional[int] = None) -> List[Record]:
        res = self.call("exec.list", drop_none(state=state, labels=labels, limit=limit))
        return [Record.from_dict(r) for r in res.get("executions") or []]

    def output(self, id: str, stream: str = "stdout", offset: int = 0, limit: Optional[int] = None,
               wait_ms: Optional[int] = None) -> Output:
        """exec.output: kept bytes of stream from offset; with wait_ms, waits
        for some when there are none yet."""
        return Output.from_dict(self.call("exec.output", drop_none(id=id, stream=stream, offset=offset, limit=limit,
                                                                    wait_ms=wait_ms)))

    def info(self) -> Info:
        return Info.from_dict(self.call("daemon.info"))

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
        give_up = None
        while True:
            try:
                conn = _Conn(self.socket, None)
            except OSError as e:
                if not resume:
                    raise ConnectionClosed(f"exec.follow: connect to corrald at {self.socket}: {e}") from e
                give_up = give_up or time.monotonic() + RESUME_FOR
                if time.monotonic() > give_up:
                    raise ConnectionClosed(f"exec.follow: corrald at {self.socket} unreachable for {RESUME_FOR}s: {e}") from e
                time.sleep(RESUME_EVERY)
                continue
            try:
                rid = conn.send("exec.follow", cursor.params(id, heartbeat_ms))
                while True:
                    msg = conn.read()
                    if msg.get("id") == rid:
                        err = msg.get("error")
                        if err is not None and int(err.get("code", 0)) == -32005 and resume:
                            raise ConnectionClosed("corrald is shutting down")
                        rec = Record.from_dict(_result("exec.follow", msg))
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
                        ev = cursor.trim(ev)
                        if ev is None:
                            continue
                        cursor.advance(ev)
                    give_up = None
                    yield ev
            except (ConnectionClosed, OSError) as e:
                if not resume:
                    raise
                give_up = give_up or time.monotonic() + RESUME_FOR
                if time.monotonic() > give_up:
                    raise ConnectionClosed(f"exec.follow: could not resume for {RESUME_FOR}s: {e}") from e
                time.sleep(RESUME_EVERY)
            finally:
                conn.close()

    def _fill(self, id: str, cursor: FollowCursor, stream: str, upto: int) -> Iterator[OutputEvent]:
        """Reads stream from the cursor up to offset upto with exec.output:
        the bytes a follow did not deliver."""
        while cursor.offsets[stream] < upto:
            out = self.output(id, stream=stream, offset=cursor.offsets[stream], limit=upto - cursor.offsets[stream])
            if not out.data:
                return
            ev = OutputEvent(id, stream, out.offset, out.data)
            cursor.advance(ev)
            yield ev

    def run(self, argv, **kw) -> Result:
        """Runs argv to the end (start, then follow) and returns the final
        record with all of stdout and stderr as bytes. Keyword arguments are
        start()'s."""
        rec = self.start(argv, **kw)
        out = {"stdout": bytearray(), "stderr": bytearray()}
        for ev in self.follow(rec.id):
            if isinstance(ev, OutputEvent):
                out[ev.stream] += ev.data
            elif isinstance(ev, EndEvent):
                rec = ev.record
        return Result(rec, bytes(out["stdout"]), bytes(out["stderr"]))


def run(argv, socket: Optional[str] = None, **kw) -> Result:
    """corral.run(["make", "test"], timeout_ms=600000): runs argv under
    corrald on a connection of its own and returns its Result."""
    with Client(socket) as c:
        return c.run(argv, **kw)
