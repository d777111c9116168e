"""The protocol's methods as requests: for each, the one place that builds
its params and parses its result, shared by Client and AsyncClient (which
only send a Call and hand its raw result to Call.parse). Also the pieces of
follow and run that do no I/O. Nothing here does I/O."""

from __future__ import annotations

import logging
import socket as _socket
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ._wire import (
    SHUTTING_DOWN,
    ConnectionClosed,
    CorralError,
    Data,
    EndEvent,
    FollowCursor,
    Info,
    Output,
    OutputEvent,
    Record,
    Result,
    drop_none,
    encode_data,
    rpc_error,
    start_params,
)

#: How long follow(), wait() and output(wait_ms=...) keep trying to
#: reconnect after their connection drops (a corrald reload takes well under
#: a second, a restart by systemd a few), dialling every RESUME_EVERY
#: seconds: corralctl's window.
RESUME_FOR = 15.0
RESUME_EVERY = 0.1

#: Where the client says it reconnected (a warning, as corralctl's stderr
#: line): "connection to corrald lost (restart or reload?); reconnected,
#: waiting for ID on".
log = logging.getLogger("corral")


class Call(NamedTuple):
    """One request: method and params to send, parse for its raw result."""

    method: str
    params: Optional[Dict[str, Any]]
    parse: Callable[[Any], Any]


def start(argv, **kw) -> Call:
    return Call("exec.start", start_params(argv, **kw), Record.from_dict)


def get(id: str) -> Call:
    return Call("exec.get", {"id": id}, Record.from_dict)


def wait(id: str, timeout_ms: Optional[int] = None) -> Call:
    return Call("exec.wait", drop_none(id=id, timeout_ms=timeout_ms), Record.from_dict)


def cancel(id: str, reason: Optional[str] = None) -> Call:
    return Call("exec.cancel", drop_none(id=id, reason=reason), Record.from_dict)


def signal(id: str, signal: str, target: Optional[str] = None) -> Call:
    return Call("exec.signal", drop_none(id=id, signal=signal, target=target), Record.from_dict)


def write(id: str, data: Data = b"", close: bool = False) -> Call:
    p: Dict[str, Any] = {"id": id}
    if data:
        p["data"] = encode_data(data)
    if close:
        p["close"] = True
    return Call("exec.write", p, lambda res: int(res.get("written", 0)))


def resize(id: str, rows: int, cols: int) -> Call:
    return Call("exec.resize", {"id": id, "rows": rows, "cols": cols}, Record.from_dict)


def update(id: str, timeout_ms: int) -> Call:
    return Call("exec.update", {"id": id, "timeout_ms": timeout_ms}, Record.from_dict)


def list(state: Optional[str] = None, labels: Optional[Dict[str, str]] = None,
         limit: Optional[int] = None) -> Call:
    return Call("exec.list", drop_none(state=state, labels=labels, limit=limit), _records)


def _records(res: Dict[str, Any]) -> List[Record]:
    return [Record.from_dict(r) for r in res.get("executions") or []]


def output(id: str, stream: str = "stdout", offset: int = 0, limit: Optional[int] = None,
           wait_ms: Optional[int] = None) -> Call:
    return Call("exec.output", drop_none(id=id, stream=stream, offset=offset, limit=limit, wait_ms=wait_ms),
                Output.from_dict)


def info() -> Call:
    return Call("daemon.info", None, Info.from_dict)


class Again:
    """A call that waits (exec.wait, exec.output with wait_ms), sent again
    over a new connection when its own breaks: corrald reloading or
    restarting ends the connection, not the execution, and the call only
    reads, so repeating it is safe. make(ms) is the call with ms (None:
    none) as its wait; each retry waits only what is left of the first ms.
    doing is what the reconnect warning says ("waiting for ID").

    The caller's loop: send call(); on an error that retryable() accepts,
    dropped(e), sleep RESUME_EVERY and dial, calling dial_failed(e) after
    each failed dial (it raises once the window is spent), then
    reconnected() and send call() again. The window is RESUME_FOR seconds
    from the drop; a call that breaks again sooner than RESUME_FOR after
    it was sent does not renew it (a socket that takes connections and
    drops them ends the loop too)."""

    def __init__(self, make: Callable[[Optional[int]], Call], ms: Optional[int], id: str, doing: str,
                 now: Callable[[], float]):
        self.make, self.ms, self.id, self.doing, self.now = make, ms, id, doing, now
        self.end = None if ms is None else now() + ms / 1000
        self.sent_at: Optional[float] = None
        self.give_up: Optional[float] = None
        self.method = ""
        self.lost: Optional[BaseException] = None

    def call(self) -> Call:
        """The call to send now."""
        ms = self.ms
        if self.sent_at is not None and self.end is not None:
            ms = max(0, int((self.end - self.now()) * 1000))
        self.sent_at = self.now()
        c = self.make(ms)
        self.method = c.method
        return c

    @staticmethod
    def retryable(e: BaseException) -> bool:
        """e broke the call in a way a new connection may mend: the
        connection closed (not a local timeout= that ran out), or corrald
        answered that it is shutting down (a handover in progress)."""
        if isinstance(e, ConnectionClosed):
            return not isinstance(e.__cause__, _socket.timeout)
        return isinstance(e, CorralError) and e.code == SHUTTING_DOWN

    def dropped(self, e: BaseException) -> None:
        """The call broke with e (retryable): opens the window, or raises
        ConnectionClosed when the last one is spent."""
        now = self.now()
        self.lost = e
        if self.give_up is None or now - (self.sent_at or now) >= RESUME_FOR:
            self.give_up = now + RESUME_FOR
        elif now >= self.give_up:
            raise self._not_regained("every new connection broke too") from e

    def dial_failed(self, e: BaseException) -> None:
        """A dial failed with e: raises ConnectionClosed once the window is
        spent (the caller sleeps RESUME_EVERY and dials again)."""
        if self.give_up is not None and self.now() >= self.give_up:
            raise self._not_regained(e) from self.lost

    def _not_regained(self, why: Any) -> ConnectionClosed:
        return ConnectionClosed(f"{self.method} {self.id}: {self.lost}; not reconnected: for {RESUME_FOR:g}s: {why}")

    def reconnected(self) -> None:
        log.warning("connection to corrald lost (restart or reload?); reconnected, %s on", self.doing)


def fill(id: str, cursor: FollowCursor, stream: str, upto: int) -> Optional[Call]:
    """The exec.output call that reads stream from the cursor up to offset
    upto (the bytes a follow did not deliver), or None once there."""
    if cursor.offsets[stream] >= upto:
        return None
    return output(id, stream=stream, offset=cursor.offsets[stream], limit=upto - cursor.offsets[stream])


def filled(id: str, cursor: FollowCursor, stream: str, out: Output) -> Optional[OutputEvent]:
    """fill's answer as an event, the cursor moved past it; None when
    corrald has nothing more (the fill ends)."""
    if not out.data:
        return None
    ev = OutputEvent(id, stream, out.offset, out.data)
    cursor.advance(ev)
    return ev


def follow_end(msg: Dict[str, Any], resume: bool) -> Record:
    """The final record of exec.follow's response msg. A shutting-down
    corrald is a dropped connection (ConnectionClosed) when resuming; any
    other error raises its CorralError."""
    err = msg.get("error")
    if err is not None:
        e = rpc_error(err)
        if e.code == SHUTTING_DOWN and resume:
            raise ConnectionClosed("corrald is shutting down")
        raise e
    return Record.from_dict(msg.get("result") or {})


class Resume:
    """follow's reconnect budget: RESUME_FOR seconds from the first drop,
    renewed by every event delivered. now is the clock (time.monotonic, or
    the event loop's time)."""

    def __init__(self, socket: str, now: Callable[[], float], id: str = ""):
        self.socket = socket
        self.now = now
        self.id = id
        self.give_up: Optional[float] = None
        self.lost = False

    def delivered(self) -> None:
        self.give_up = None

    def connected(self) -> None:
        """A connection is up again: say so once after a drop, as
        corralctl does."""
        if self.lost:
            self.lost = False
            log.warning("connection to corrald lost (restart or reload?); reconnected, following %s on", self.id)

    def connect_failed(self, resume: bool, e: BaseException) -> None:
        """Raises ConnectionClosed unless it may dial again (then the caller
        sleeps RESUME_EVERY)."""
        if not resume:
            raise ConnectionClosed(f"exec.follow: connect to corrald at {self.socket}: {e}") from e
        self._or_give_up(f"exec.follow: corrald at {self.socket} unreachable for {RESUME_FOR}s: {e}", e)

    def dropped(self, e: BaseException) -> None:
        """Raises ConnectionClosed once the budget is spent (the caller
        re-raises e itself when not resuming)."""
        self.lost = True
        self._or_give_up(f"exec.follow: could not resume for {RESUME_FOR}s: {e}", e)

    def _or_give_up(self, message: str, e: BaseException) -> None:
        self.give_up = self.give_up or self.now() + RESUME_FOR
        if self.now() > self.give_up:
            raise ConnectionClosed(message) from e


class Collector:
    """run's output: all bytes of stdout and stderr and the final record,
    from follow's events."""

    def __init__(self, rec: Record):
        self.rec = rec
        self.out = {"stdout": bytearray(), "stderr": bytearray()}

    def add(self, ev: Any) -> None:
        if isinstance(ev, OutputEvent):
            self.out[ev.stream] += ev.data
        elif isinstance(ev, EndEvent):
            self.rec = ev.record

    def result(self) -> Result:
        return Result(self.rec, bytes(self.out["stdout"]), bytes(self.out["stderr"]))
