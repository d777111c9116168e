"""The protocol's methods as requests: for each, the one place that builds
its params and parses its result, shared by Client and AsyncClient (which
only send a Call and hand its raw result to Call.parse). Also the pieces of
follow and run that do no I/O. Nothing here does I/O."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ._wire import (
    SHUTTING_DOWN,
    ConnectionClosed,
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

#: How long follow() keeps trying to reconnect after its connection drops
#: (a corrald restart or handover takes a second or two).
RESUME_FOR = 15.0
RESUME_EVERY = 0.1


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

    def __init__(self, socket: str, now: Callable[[], float]):
        self.socket = socket
        self.now = now
        self.give_up: Optional[float] = None

    def delivered(self) -> None:
        self.give_up = None

    def connect_failed(self, resume: bool, e: BaseException) -> None:
        """Raises ConnectionClosed unless it may dial again (then the caller
        sleeps RESUME_EVERY)."""
        if not resume:
            raise ConnectionClosed(f"exec.follow: connect to corrald at {self.socket}: {e}") from e
        self._or_give_up(f"exec.follow: corrald at {self.socket} unreachable for {RESUME_FOR}s: {e}", e)

    def dropped(self, e: BaseException) -> None:
        """Raises ConnectionClosed once the budget is spent (the caller
        re-raises e itself when not resuming)."""
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
