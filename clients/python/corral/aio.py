"""The asyncio client of corrald: the same methods as corral.Client, as
coroutines, with any number of calls in flight on one connection.

    async with await corral.aio.connect() as c:
        r = await c.run(["echo", "hi"])
        async for ev in c.follow(rec.id): ...
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Dict, List, Optional

from . import _calls
from ._calls import RESUME_EVERY, Again, Call, Collector, Resume
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

# Responses can be large (exec.list); lines are bounded well above that.
_READ_LIMIT = 64 << 20


class _AsyncConn:
    """One connection with a reader task that completes each request's
    future; notifications go to notes (used by follow's own connection)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.next_id = 0
        self.pending: Dict[int, asyncio.Future] = {}
        self.notes: asyncio.Queue = asyncio.Queue()
        self.streams: set = set()  # request ids whose response also goes to notes
        self.closed: Optional[BaseException] = None
        self.task = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def open(cls, path: str) -> "_AsyncConn":
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=_READ_LIMIT)
        except OSError as e:
            raise ConnectionClosed(f"connect to corrald at {path}: {e} (is corrald running? CORRAL_SOCKET names its socket)") from e
        return cls(reader, writer)

    async def _read_loop(self) -> None:
        err: BaseException = ConnectionClosed("corrald closed the connection")
        last_word: Optional[Dict[str, Any]] = None
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                line = line.strip()
                if not line:
                    continue
                msg = json.loads(line)
                mid = msg.get("id")
                if mid is None:
                    if msg.get("method"):
                        self.notes.put_nowait(msg)
                    elif msg.get("error"):
                        last_word = msg["error"]
                    continue
                fut = self.pending.pop(mid, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
                if mid in self.streams:
                    # After the notifications it answers, in order.
                    self.notes.put_nowait({"response": msg})
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            err = ConnectionClosed(f"read from corrald: {e}")
        except asyncio.CancelledError:
            err = ConnectionClosed("connection closed")
        if last_word is not None:
            err = rpc_error(last_word)
        self.closed = err
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()
        self.notes.put_nowait(None)  # wakes a follow

    def send(self, method: str, params: Any, stream: bool = False) -> "Optional[asyncio.Future]":
        """Queues a request. Its response completes the returned future or,
        with stream, arrives in notes after the notifications before it
        (then there is no future)."""
        if self.closed is not None:
            raise ConnectionClosed(f"{method}: {self.closed}")
        self.next_id += 1
        line = encode_request(self.next_id, method, params)
        fut = None
        if stream:
            self.streams.add(self.next_id)
        else:
            fut = asyncio.get_running_loop().create_future()
            self.pending[self.next_id] = fut
        self.writer.write(line)
        return fut

    async def call(self, method: str, params: Any = None) -> Any:
        fut = self.send(method, params)
        try:
            await self.writer.drain()
        except OSError as e:
            raise ConnectionClosed(f"{method}: send to corrald: {e}") from e
        msg = await fut
        if msg.get("error") is not None:
            raise rpc_error(msg["error"])
        return msg.get("result")

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


async def connect(socket: Optional[str] = None) -> "AsyncClient":
    """Connects to corrald (default $CORRAL_SOCKET, else the default path)."""
    c = AsyncClient(socket)
    await c._dial()
    return c


class AsyncClient:
    """corral.Client's methods as coroutines. Use connect(), or
    ``async with AsyncClient() as c``. Calls may run concurrently. Across a
    corrald reload or restart it does as Client: wait(), output() with
    wait_ms and follow() dial again for up to RESUME_FOR seconds and go on;
    any other call whose connection breaks raises ConnectionClosed (it may
    or may not have been done) and the next call dials again."""

    def __init__(self, socket: Optional[str] = None):
        self.socket = socket or default_socket()
        self._conn: Optional[_AsyncConn] = None
        self._dial_lock: Optional[asyncio.Lock] = None

    async def _dial(self) -> _AsyncConn:
        if self._dial_lock is None:
            self._dial_lock = asyncio.Lock()
        async with self._dial_lock:
            if self._conn is None or self._conn.closed is not None:
                self._conn = await _AsyncConn.open(self.socket)
            return self._conn

    async def __aenter__(self) -> "AsyncClient":
        await self._dial()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def call(self, method: str, params: Any = None) -> Any:
        conn = await self._dial()
        return await conn.call(method, params)

    # The protocol's methods: _calls builds each one's params and parses
    # its result, as for Client.

    async def _do(self, c: Call) -> Any:
        return c.parse(await self.call(c.method, c.params))

    async def start(self, argv, **kw) -> Record:
        return await self._do(_calls.start(argv, **kw))

    async def get(self, id: str) -> Record:
        return await self._do(_calls.get(id))

    async def wait(self, id: str, timeout_ms: Optional[int] = None) -> Record:
        return await self._again(Again(lambda ms: _calls.wait(id, ms), timeout_ms, id, f"waiting for {id}",
                                       asyncio.get_running_loop().time))

    async def _again(self, a: Again) -> Any:
        """Client._again: sends a's call, and again over a new connection
        when its own breaks."""
        while True:
            try:
                return await self._do(a.call())
            except (ConnectionClosed, CorralError) as e:
                if not a.retryable(e):
                    raise
                a.dropped(e)
            while True:
                await asyncio.sleep(RESUME_EVERY)
                try:
                    await self._dial()
                    break
                except ConnectionClosed as e:
                    a.dial_failed(e)
            a.reconnected()

    async def cancel(self, id: str, reason: Optional[str] = None) -> Record:
        return await self._do(_calls.cancel(id, reason))

    async def signal(self, id: str, signal: str, target: Optional[str] = None) -> Record:
        return await self._do(_calls.signal(id, signal, target))

    async def write(self, id: str, data: Data = b"", close: bool = False) -> int:
        return await self._do(_calls.write(id, data, close))

    async def resize(self, id: str, rows: int, cols: int) -> Record:
        return await self._do(_calls.resize(id, rows, cols))

    async def update(self, id: str, timeout_ms: int) -> Record:
        return await self._do(_calls.update(id, timeout_ms))

    async def list(self, state: Optional[str] = None, labels: Optional[Dict[str, str]] = None,
                   limit: Optional[int] = None) -> List[Record]:
        return await self._do(_calls.list(state, labels, limit))

    async def output(self, id: str, stream: str = "stdout", offset: int = 0, limit: Optional[int] = None,
                     wait_ms: Optional[int] = None) -> Output:
        if wait_ms is None:
            return await self._do(_calls.output(id, stream, offset, limit))
        return await self._again(Again(lambda ms: _calls.output(id, stream, offset, limit, ms), wait_ms, id,
                                       f"waiting for {id}'s {stream}", asyncio.get_running_loop().time))

    async def info(self) -> Info:
        return await self._do(_calls.info())

    async def follow(self, id: str, stdout_offset: int = 0, stderr_offset: int = 0,
                     heartbeat_ms: Optional[int] = None, resume: bool = True) -> AsyncIterator[Event]:
        """As Client.follow: events on a connection of their own, resumed
        from the last byte yielded when the connection drops."""
        loop = asyncio.get_running_loop()
        cursor = FollowCursor(stdout_offset, stderr_offset)
        budget = Resume(self.socket, loop.time, id)
        while True:
            try:
                conn = await _AsyncConn.open(self.socket)
            except OSError as e:
                budget.connect_failed(resume, e)
                await asyncio.sleep(RESUME_EVERY)
                continue
            budget.connected()
            try:
                conn.send("exec.follow", cursor.params(id, heartbeat_ms), stream=True)
                await conn.writer.drain()
                while True:
                    msg = await conn.notes.get()
                    if msg is None:
                        raise ConnectionClosed("follow connection dropped")
                    if "response" in msg:
                        res = msg["response"]
                        break
                    ev = note_event(msg["method"], msg.get("params") or {})
                    if ev is None:
                        continue
                    if isinstance(ev, OutputEvent):
                        async for f in self._fill(id, cursor, ev.stream, ev.offset):
                            yield f
                        ev = cursor.take(ev)
                        if ev is None:
                            continue
                    budget.delivered()
                    yield ev
                rec = _calls.follow_end(res, resume)
                for s, info in (("stdout", rec.stdout), ("stderr", rec.stderr)):
                    if info is not None:
                        async for f in self._fill(id, cursor, s, info.total_bytes):
                            yield f
                yield EndEvent(rec)
                return
            except (ConnectionClosed, OSError) as e:
                if not resume:
                    raise
                budget.dropped(e)
                await asyncio.sleep(RESUME_EVERY)
            finally:
                await conn.close()

    async def _fill(self, id: str, cursor: FollowCursor, stream: str, upto: int) -> AsyncIterator[OutputEvent]:
        while True:
            c = _calls.fill(id, cursor, stream, upto)
            if c is None:
                return
            ev = _calls.filled(id, cursor, stream, await self._do(c))
            if ev is None:
                return
            yield ev

    async def run(self, argv, **kw) -> Result:
        col = Collector(await self.start(argv, **kw))
        async for ev in self.follow(col.rec.id):
            col.add(ev)
        return col.result()


async def run(argv, socket: Optional[str] = None, **kw) -> Result:
    """The asyncio corral.run."""
    async with AsyncClient(socket) as c:
        return await c.run(argv, **kw)
