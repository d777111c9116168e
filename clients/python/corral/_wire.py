"""Wire types of corral's protocol (docs/protocol.md): errors, records,
events, the request line and the error object, shared by the sync and
asyncio clients (each method's params and result: _calls).

Nothing here does I/O. Every result type keeps the keys it does not know
in ``extra``, so a newer corrald's additions are never lost.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

DEFAULT_SOCKET = "/run/corral/corrald.sock"
SOCKET_ENV = "CORRAL_SOCKET"

#: A line longer than this is refused by corrald (and by this client).
MAX_LINE_BYTES = 1 << 20

# JSON-RPC's own error codes and corral's (docs/protocol.md, "Error codes").
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NOT_FOUND = -32001
PERMISSION_DENIED = -32002
OVER_CAPACITY = -32003
IDEMPOTENCY_CONFLICT = -32004
SHUTTING_DOWN = -32005


def default_socket() -> str:
    """$CORRAL_SOCKET, else /run/corral/corrald.sock."""
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class CorralError(Exception):
    """An error answered by corrald: ``code`` is the JSON-RPC error code
    (compare with NOT_FOUND, INVALID_PARAMS, ...), ``message`` its text."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data


class ConnectionClosed(ConnectionError):
    """The connection to corrald ended before the answer came."""


Data = Union[bytes, bytearray, memoryview, str]


def encode_request(rid: int, method: str, params: Any) -> bytes:
    """The request's line (newline-terminated JSON-RPC 2.0); CorralError
    INVALID_REQUEST when it is over corrald's line limit."""
    msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    # ensure_ascii=False: a str that is not valid UTF-8 (os.fsdecode() of
    # undecodable bytes leaves lone surrogates) fails here instead of being
    # sent as a \udcXX escape, which corrald reads as U+FFFD: another command.
    try:
        line = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    except UnicodeEncodeError as e:
        bad = e.object[e.start:e.end] if isinstance(e.object, str) else ""
        raise CorralError(
            INVALID_PARAMS,
            f"{method}: a string is not valid UTF-8 ({bad!r}, as os.fsdecode() leaves undecodable bytes): "
            "corrald's protocol carries only text, and those bytes would arrive as U+FFFD",
        ) from None
    if len(line) > MAX_LINE_BYTES:
        raise CorralError(INVALID_REQUEST, f"{method}: request is {len(line)} bytes, over corrald's {MAX_LINE_BYTES}-byte line limit")
    return line


def rpc_error(err: Dict[str, Any]) -> CorralError:
    """The CorralError of a response's error object."""
    return CorralError(int(err.get("code", INTERNAL_ERROR)), str(err.get("message", "")), err.get("data"))


def encode_data(data: Data) -> str:
    """base64 of data (str is encoded as UTF-8), as fields named data travel."""
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(bytes(data)).decode("ascii")


def decode_data(s: Optional[str]) -> bytes:
    return base64.b64decode(s) if s else b""


def _build(cls, d: Optional[Dict[str, Any]]):
    """cls from the dict d: known fields set (nested dataclasses built by
    their own from_dict), the rest kept in extra."""
    if d is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    extra = {}
    for k, v in d.items():
        if k in names and k != "extra":
            kw[k] = v
        else:
            extra[k] = v
    obj = cls(**kw)
    obj.extra = extra
    return obj


@dataclass
class Owner:
    uid: int = 0
    gid: int = 0
    pid: int = 0
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Usage:
    cpu_user_ms: int = 0
    cpu_system_ms: int = 0
    peak_memory_bytes: int = 0
    tasks_peak: int = 0
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class StreamInfo:
    total_bytes: int = 0
    kept_bytes: int = 0
    truncated: bool = False
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class TTYSize:
    """A terminal's window size in character cells."""

    rows: int = 0
    cols: int = 0
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


#: States in order; they only move forward.
STATES = ("started", "running", "canceling", "exited", "cleaned")


@dataclass
class Record:
    """An execution record (exec.start, exec.get, exec.wait, ...)."""

    id: str = ""
    owner: Optional[Owner] = None
    argv: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    state: str = ""
    outcome: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    error: Optional[str] = None
    pid: Optional[int] = None
    scope: Optional[str] = None
    workspace: Optional[str] = None
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    exited_at: Optional[str] = None
    cleaned_at: Optional[str] = None
    deadline: Optional[str] = None
    duration_ms: int = 0
    usage: Optional[Usage] = None
    stdout: Optional[StreamInfo] = None
    stderr: Optional[StreamInfo] = None
    # Extensions beyond protocol v1 (docs/protocol.md, "Execution record").
    user: Optional[str] = None
    network: Optional[str] = None
    backend: Optional[str] = None
    timeout_ms: int = 0
    cancel_reason: Optional[str] = None
    cancel_outcome: Optional[str] = None
    leftover_tasks: int = 0
    start_errno: Optional[str] = None
    unenforced: List[str] = field(default_factory=list)
    # Protocol v1.1: terminals, idle timeouts, movable deadlines, survival.
    tty: bool = False
    tty_size: Optional[TTYSize] = None
    idle_timeout_ms: int = 0
    adopted: int = 0
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Record":
        r = _build(cls, d)
        r.owner = _build(Owner, d.get("owner"))
        r.usage = _build(Usage, d.get("usage"))
        r.stdout = _build(StreamInfo, d.get("stdout"))
        r.stderr = _build(StreamInfo, d.get("stderr"))
        r.tty_size = _build(TTYSize, d.get("tty_size"))
        r.labels = r.labels or {}
        r.unenforced = r.unenforced or []
        return r

    @property
    def finished(self) -> bool:
        """The main process has been reaped (exited or cleaned)."""
        return self.state in ("exited", "cleaned")

    @property
    def cleaned(self) -> bool:
        """Terminal: the whole tree is gone."""
        return self.state == "cleaned"


@dataclass
class Output:
    """exec.output's result; data is bytes."""

    data: bytes = b""
    offset: int = 0
    next_offset: int = 0
    total_bytes: int = 0
    eof: bool = False
    gap: bool = False
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Output":
        o = _build(cls, d)
        o.data = decode_data(d.get("data"))
        return o


@dataclass
class Info:
    """daemon.info's result."""

    version: str = ""
    pid: int = 0
    backend: str = ""
    pidfd: bool = False
    cgroup: str = ""
    kernel: str = ""
    defaults: Dict[str, Any] = field(default_factory=dict)
    running: int = 0
    total: int = 0
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Info":
        i = _build(cls, d)
        i.defaults = i.defaults or {}
        return i


# Events of follow(). Every event has the execution's id.


@dataclass
class OutputEvent:
    """Bytes of a stream at offset (stream offsets count every byte written)."""

    id: str
    stream: str
    offset: int
    data: bytes


@dataclass
class StateEvent:
    """The execution moved to record.state."""

    record: Record

    @property
    def id(self) -> str:
        return self.record.id


@dataclass
class HeartbeatEvent:
    id: str
    usage: Usage


@dataclass
class EndEvent:
    """The last event: the execution is cleaned; record is final."""

    record: Record

    @property
    def id(self) -> str:
        return self.record.id


Event = Union[OutputEvent, StateEvent, HeartbeatEvent, EndEvent]


@dataclass
class Result:
    """What run() returns: the final record and all of the output."""

    record: Record
    stdout: bytes
    stderr: bytes

    @property
    def exit_code(self) -> Optional[int]:
        return self.record.exit_code

    @property
    def outcome(self) -> Optional[str]:
        return self.record.outcome

    @property
    def ok(self) -> bool:
        """The command exited by itself with status 0."""
        return self.record.outcome == "exited" and self.record.exit_code == 0


def start_params(argv, **kw) -> Dict[str, Any]:
    """exec.start's params from argv and keyword arguments named as the
    protocol's fields (env, cwd, stdin, stdin_open, timeout_ms, grace_ms,
    cpu_ms, memory_bytes, tasks_max, output_limit_bytes, labels, id, user,
    network, redact, tty, tty_size, idle_timeout_ms, traceparent, ...). stdin
    may be bytes or str; tty_size may be a TTYSize or {"rows": R, "cols": C}.
    None values are left out."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of strings, not a single string (use ['sh', '-c', cmd] for a shell line)")
    p: Dict[str, Any] = {"argv": list(argv)}
    for k, v in kw.items():
        if v is None:
            continue
        if k == "stdin":
            v = encode_data(v)
        elif k == "tty_size" and isinstance(v, TTYSize):
            v = {"rows": v.rows, "cols": v.cols}
        p[k] = v
    return p


def drop_none(**kw) -> Dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def note_event(method: str, params: Dict[str, Any]) -> Optional[Event]:
    """The follow event of a daemon notification, or None for others."""
    if method == "exec.output":
        return OutputEvent(params.get("id", ""), params.get("stream", "stdout"), int(params.get("offset", 0)),
                           decode_data(params.get("data")))
    if method == "exec.state":
        return StateEvent(Record.from_dict(params.get("record") or {}))
    if method == "exec.heartbeat":
        return HeartbeatEvent(params.get("id", ""), _build(Usage, params.get("usage") or {}))
    return None


class FollowCursor:
    """Where a follow has got to in each stream, so that it can resume on a
    new connection without losing or repeating a byte. trim() cuts an
    OutputEvent to the bytes past the cursor (None if it has none)."""

    def __init__(self, stdout_offset: int = 0, stderr_offset: int = 0):
        self.offsets = {"stdout": stdout_offset, "stderr": stderr_offset}

    def trim(self, ev: OutputEvent) -> Optional[OutputEvent]:
        cur = self.offsets.get(ev.stream, 0)
        end = ev.offset + len(ev.data)
        if end <= cur:
            return None
        if ev.offset < cur:
            ev = OutputEvent(ev.id, ev.stream, cur, ev.data[cur - ev.offset:])
        return ev

    def advance(self, ev: OutputEvent) -> None:
        self.offsets[ev.stream] = ev.offset + len(ev.data)

    def take(self, ev: OutputEvent) -> Optional[OutputEvent]:
        """trim, then advance past what is left: the event to deliver, or
        None when the cursor already had all of it."""
        ev = self.trim(ev)
        if ev is not None:
            self.advance(ev)
        return ev

    def params(self, id: str, heartbeat_ms: Optional[int]) -> Dict[str, Any]:
        return drop_none(id=id, stdout_offset=self.offsets["stdout"], stderr_offset=self.offsets["stderr"],
                         heartbeat_ms=heartbeat_ms)
