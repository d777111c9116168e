"""Tests of the corral Python client against a real corrald.

Run by tests/pyclient (make test), which starts corrald and sets
CORRAL_SOCKET, CORRAL_TEST_MAX_PER_UID (corrald's --max-per-uid) and, when
it runs as root, CORRAL_TEST_USER (an unprivileged user that may use the
socket). Without CORRAL_SOCKET every test fails: there is nothing to test
against.
"""

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import corral  # noqa: E402
from corral import aio  # noqa: E402

SOCKET = os.environ.get("CORRAL_SOCKET", "")


def label():
    """A label unique to one test, to find its executions with list()."""
    return {"pytest": uuid.uuid4().hex}


def daemon_pid():
    pid = int(os.environ.get("CORRAL_TEST_DAEMON_PID", "0"))
    if pid <= 0:
        raise AssertionError("CORRAL_TEST_DAEMON_PID is not set")
    return pid


def started_at():
    """corrald's started_at, asked on a connection of its own."""
    with corral.Client(SOCKET) as c:
        return c.info().extra.get("started_at")


def handover(before):
    """Reloads corrald (SIGHUP: it re-executes itself, same pid, and takes
    the executions over) and returns once the new image answers."""
    os.kill(daemon_pid(), signal.SIGHUP)
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        try:
            if started_at() != before:
                return
        except corral.ConnectionClosed:
            pass
        time.sleep(0.05)
    raise AssertionError("corrald did not hand over within 60 s")


def until(cond, what):
    give_up = time.monotonic() + 60
    while not cond():
        if time.monotonic() > give_up:
            raise AssertionError(f"not {what} within 60 s")
        time.sleep(0.01)


class DropProxy:
    """A Unix socket that forwards each connection to corrald and can cut
    them all at once: a dropped connection, as a corrald restart or a
    network blip gives, without touching corrald."""

    def __init__(self, target):
        self.target = target
        self.dir = tempfile.mkdtemp(prefix="corral-pyproxy-")
        self.path = os.path.join(self.dir, "proxy.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(16)
        self.lock = threading.Lock()
        self.live = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            b.connect(self.target)
            with self.lock:
                self.accepted += 1
                self.live.append((a, b))
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop_all(self):
        with self.lock:
            live, self.live = self.live, []
        for a, b in live:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.listener.close()
        self.drop_all()
        shutil.rmtree(self.dir, ignore_errors=True)


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(SOCKET, "CORRAL_SOCKET is not set: run these tests through tests/pyclient (make test)")
        self.c = corral.Client(SOCKET)
        self.addCleanup(self.c.close)
        self.started = []

    def tearDown(self):
        for id in self.started:
            try:
                self.c.cancel(id)
                self.c.wait(id, timeout_ms=10000)
            except corral.CorralError:
                pass

    def start(self, argv, **kw):
        rec = self.c.start(argv, **kw)
        self.started.append(rec.id)
        return rec

    # info, start, get, wait

    def test_info(self):
        i = self.c.info()
        self.assertIsInstance(i, corral.Info)
        self.assertIn(i.backend, ("systemd", "cgroup", "pgroup"))
        self.assertGreater(i.pid, 0)
        self.assertTrue(i.version)
        self.assertIn("timeout_ms", i.defaults)

    def test_start_get_wait(self):
        lab = label()
        rec = self.start(["sh", "-c", "echo out; echo err >&2; exit 7"], labels=lab, env={"A": "1"})
        self.assertIsInstance(rec, corral.Record)
        self.assertIn(rec.state, corral.STATES)
        self.assertEqual(rec.argv, ["sh", "-c", "echo out; echo err >&2; exit 7"])
        self.assertEqual(rec.labels, lab)
        self.assertEqual(rec.owner.uid, os.geteuid())
        done = self.c.wait(rec.id)
        self.assertEqual(done.state, "cleaned")
        self.assertTrue(done.cleaned and done.finished)
        self.assertEqual((done.outcome, done.exit_code, done.signal), ("exited", 7, None))
        self.assertEqual((done.stdout.total_bytes, done.stderr.total_bytes), (4, 4))
        self.assertIsInstance(done.usage, corral.Usage)
        got = self.c.get(rec.id)
        self.assertEqual((got.id, got.state, got.exit_code), (rec.id, "cleaned", 7))

    def test_wait_timeout_returns_current_record(self):
        rec = self.start(["sleep", "30"])
        t0 = time.monotonic()
        cur = self.c.wait(rec.id, timeout_ms=200)
        self.assertEqual(cur.state, "running")
        self.assertLess(time.monotonic() - t0, 20)

    def test_client_timeout_is_not_retried(self):
        # timeout= bounds each call: a wait it cuts short raises at once,
        # it is not taken for a reload and asked again.
        rec = self.start(["sleep", "30"])
        with corral.Client(SOCKET, timeout=0.3) as c:
            with self.assertRaises(corral.ConnectionClosed) as cm:
                c.wait(rec.id)
        self.assertIn("timed out", str(cm.exception))
        self.assertNotIn("not reconnected", str(cm.exception))

    def test_start_failed_is_a_record(self):
        rec = self.c.wait(self.start(["/no/such/program"]).id)
        self.assertEqual(rec.outcome, "start_failed")
        self.assertTrue(rec.error)

    def test_stdin_data(self):
        r = self.c.run(["cat"], stdin="piped in")
        self.assertEqual(r.stdout, b"piped in")

    def test_idempotency_key(self):
        key = "py-" + uuid.uuid4().hex
        a = self.start(["sleep", "30"], id=key)
        b = self.c.start(["sleep", "30"], id=key)
        self.assertEqual((a.id, b.id), (key, key))
        with self.assertRaises(corral.CorralError) as cm:
            self.c.start(["sleep", "31"], id=key)
        self.assertEqual(cm.exception.code, corral.IDEMPOTENCY_CONFLICT)

    # cancel, signal

    def test_cancel(self):
        rec = self.start(["sh", "-c", "sleep 1000 & sleep 1000"])
        self.c.cancel(rec.id, reason="py test")
        done = self.c.wait(rec.id, timeout_ms=20000)
        self.assertEqual((done.state, done.outcome), ("cleaned", "cancelled"))
        again = self.c.cancel(rec.id)
        self.assertEqual(again.outcome, "cancelled")

    def test_signal(self):
        rec = self.start(["sleep", "30"])
        self.c.wait(rec.id, timeout_ms=100)
        self.c.signal(rec.id, "SIGKILL", target="main")
        done = self.c.wait(rec.id, timeout_ms=20000)
        self.assertEqual(done.signal, "SIGKILL")
        self.assertEqual(done.exit_code, None)

    # write, resize, update

    def test_write(self):
        rec = self.start(["cat"], stdin_open=True)
        self.assertEqual(self.c.write(rec.id, b"hello "), 6)
        self.assertEqual(self.c.write(rec.id, "world"), 5)
        self.c.write(rec.id, close=True)
        done = self.c.wait(rec.id, timeout_ms=20000)
        self.assertEqual(done.exit_code, 0)
        self.assertEqual(self.c.output(rec.id).data, b"hello world")

    def test_resize_on_a_terminal(self):
        rec = self.start(["sh", "-c", "read x; stty size"], tty=True, tty_size=corral.TTYSize(rows=24, cols=80))
        self.assertEqual((rec.tty_size.rows, rec.tty_size.cols), (24, 80))
        r = self.c.resize(rec.id, 40, 100)
        self.assertEqual(r.id, rec.id)
        self.assertEqual((r.tty_size.rows, r.tty_size.cols), (40, 100))
        self.assertNotIn("tty_size", r.extra)
        self.c.write(rec.id, "\n")
        done = self.c.wait(rec.id, timeout_ms=20000)
        self.assertEqual(done.exit_code, 0)
        self.assertIn(b"40 100", self.c.output(rec.id).data)
        self.assertTrue(done.tty)

    def test_resize_without_terminal(self):
        rec = self.start(["sleep", "30"])
        with self.assertRaises(corral.CorralError) as cm:
            self.c.resize(rec.id, 40, 100)
        self.assertEqual(cm.exception.code, corral.INVALID_PARAMS)

    def test_update(self):
        rec = self.start(["sleep", "60"], timeout_ms=60000)
        up = self.c.update(rec.id, 300)
        self.assertTrue(up.deadline)
        self.assertTrue(0 < up.timeout_ms < 60000, up.timeout_ms)
        done = self.c.wait(rec.id, timeout_ms=30000)
        self.assertEqual(done.outcome, "timeout")
        self.assertIn(done.backend, ("cgroup", "pgroup", "systemd"))
        self.assertEqual(done.extra, {})
        with self.assertRaises(corral.CorralError) as cm:
            self.c.update(rec.id, 1000)
        self.assertEqual(cm.exception.code, corral.INVALID_PARAMS)

    # list, output

    def test_list(self):
        lab = label()
        a = self.start(["sleep", "30"], labels=lab)
        b = self.start(["true"], labels=lab)
        self.c.wait(b.id)
        got = {r.id: r for r in self.c.list(labels=lab)}
        self.assertEqual(set(got), {a.id, b.id})
        self.assertTrue(all(isinstance(r, corral.Record) for r in got.values()))
        running = self.c.list(state="running", labels=lab)
        self.assertEqual([r.id for r in running], [a.id])
        self.assertEqual(len(self.c.list(labels=lab, limit=1)), 1)

    def test_output(self):
        rec = self.start(["sh", "-c", "printf 0123456789; printf EE >&2"])
        self.c.wait(rec.id)
        o = self.c.output(rec.id, offset=2, limit=3)
        self.assertIsInstance(o, corral.Output)
        self.assertEqual((o.data, o.offset, o.next_offset, o.total_bytes, o.eof), (b"234", 2, 5, 10, False))
        rest = self.c.output(rec.id, offset=o.next_offset)
        self.assertEqual((rest.data, rest.eof), (b"56789", True))
        self.assertEqual(self.c.output(rec.id, stream="stderr").data, b"EE")

    def test_output_wait_ms(self):
        rec = self.start(["sh", "-c", "sleep 0.5; echo late; sleep 30"])
        o = self.c.output(rec.id, wait_ms=20000)
        # A long-poll: the answer is the line, not an empty timeout.
        self.assertEqual(o.data, b"late\n")

    def test_output_binary(self):
        r = self.c.run(["head", "-c", "256", "/dev/urandom"])
        self.assertEqual(len(r.stdout), 256)
        self.assertEqual(self.c.output(r.record.id).data, r.stdout)

    # follow

    def test_follow_events(self):
        rec = self.start(["sh", "-c", "echo one; sleep 0.2; echo two >&2; sleep 0.3; echo three"])
        out = {"stdout": b"", "stderr": b""}
        kinds = []
        for ev in self.c.follow(rec.id, heartbeat_ms=100):
            kinds.append(type(ev).__name__)
            if isinstance(ev, corral.OutputEvent):
                self.assertEqual(ev.offset, len(out[ev.stream]), "offsets are contiguous")
                out[ev.stream] += ev.data
            elif isinstance(ev, corral.EndEvent):
                self.assertEqual((ev.record.state, ev.record.exit_code), ("cleaned", 0))
        self.assertEqual(out, {"stdout": b"one\nthree\n", "stderr": b"two\n"})
        self.assertEqual(kinds[-1], "EndEvent")
        self.assertIn("StateEvent", kinds)
        self.assertIn("HeartbeatEvent", kinds)

    def test_follow_from_offsets(self):
        rec = self.start(["sh", "-c", "printf abcdef"])
        self.c.wait(rec.id)
        data = b"".join(ev.data for ev in self.c.follow(rec.id, stdout_offset=3) if isinstance(ev, corral.OutputEvent))
        self.assertEqual(data, b"def")

    def test_follow_resumes_after_dropped_connection(self):
        proxy = DropProxy(SOCKET)
        self.addCleanup(proxy.close)
        c = corral.Client(proxy.path)
        self.addCleanup(c.close)
        n = 40
        rec = self.start(["sh", "-c", f"for i in $(seq 1 {n}); do echo line $i; sleep 0.05; done"])
        out = b""
        drops = 0
        end = None
        with self.assertLogs("corral", "WARNING") as logs:
            for ev in c.follow(rec.id):
                if isinstance(ev, corral.OutputEvent):
                    self.assertEqual(ev.offset, len(out), "no byte lost or repeated across a drop")
                    out += ev.data
                    if drops < 3 and out.count(b"\n") >= 5 * (drops + 1):
                        proxy.drop_all()
                        drops += 1
                elif isinstance(ev, corral.EndEvent):
                    end = ev.record
        self.assertEqual(drops, 3)
        self.assertEqual(len(logs.output), 3, logs.output)
        self.assertEqual(out, b"".join(b"line %d\n" % i for i in range(1, n + 1)))
        self.assertEqual(end.exit_code, 0)
        self.assertGreaterEqual(proxy.accepted, 4, "follow reconnected after each drop")

    def test_follow_across_a_corrald_handover(self):
        pid = daemon_pid()
        before = self.c.info().extra.get("started_at")
        rec = self.start(["sh", "-c", "for i in $(seq 1 20); do echo tick $i; sleep 0.1; done; exit 5"])
        out = b""
        sent = False
        end = None
        with self.assertLogs("corral", "WARNING") as logs:
            for ev in self.c.follow(rec.id):
                if isinstance(ev, corral.OutputEvent):
                    self.assertEqual(ev.offset, len(out))
                    out += ev.data
                    if not sent and out.count(b"\n") >= 3:
                        os.kill(pid, signal.SIGHUP)  # corrald re-executes itself, same pid
                        sent = True
                elif isinstance(ev, corral.EndEvent):
                    end = ev.record
        self.assertTrue(sent)
        self.assertIn(f"connection to corrald lost (restart or reload?); reconnected, following {rec.id} on",
                      "\n".join(logs.output))
        self.assertEqual(out, b"".join(b"tick %d\n" % i for i in range(1, 21)))
        self.assertEqual((end.outcome, end.exit_code), ("exited", 5))
        info = self.c.info()
        self.assertEqual(info.pid, pid)
        self.assertNotEqual(info.extra.get("started_at"), before, "corrald did not hand over")

    def test_follow_without_resume_raises(self):
        proxy = DropProxy(SOCKET)
        self.addCleanup(proxy.close)
        c = corral.Client(proxy.path)
        self.addCleanup(c.close)
        rec = self.start(["sh", "-c", "echo a; sleep 30"])
        with self.assertRaises(corral.ConnectionClosed):
            for ev in c.follow(rec.id, resume=False):
                if isinstance(ev, corral.OutputEvent):
                    proxy.drop_all()

    def test_call_after_dropped_connection_redials(self):
        proxy = DropProxy(SOCKET)
        self.addCleanup(proxy.close)
        c = corral.Client(proxy.path)
        self.addCleanup(c.close)
        c.info()
        proxy.drop_all()
        # Closed while idle: replaced before the next call, which succeeds.
        self.assertTrue(c.info().version)
        self.assertEqual(proxy.accepted, 2)
        # Broken during a call sent once (call(), as every method but the
        # waits): that call raises, the next one redials.
        rec = self.start(["sleep", "30"])
        threading.Timer(0.3, proxy.drop_all).start()
        with self.assertRaises(corral.ConnectionClosed):
            c.call("exec.wait", {"id": rec.id})
        self.assertEqual(c.get(rec.id).state, "running")

    def test_wait_and_output_across_a_corrald_handover(self):
        # exec.wait and a long exec.output in flight when corrald reloads
        # are asked again over a new connection and answer as if nothing
        # happened (the execution was handed over).
        go = os.path.join(tempfile.mkdtemp(prefix="corral-pygo-"), "go")
        self.addCleanup(shutil.rmtree, os.path.dirname(go), True)
        before = started_at()
        rec = self.start(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo late; exit 5"])
        c2 = corral.Client(SOCKET)
        self.addCleanup(c2.close)
        got = {}

        def call(name, f):
            try:
                got[name] = f()
            except Exception as e:  # the test's failure, reported below
                got[name] = e

        calls = [threading.Thread(target=call, args=("wait", lambda: self.c.wait(rec.id))),
                 threading.Thread(target=call, args=("output", lambda: c2.output(rec.id, wait_ms=50000)))]
        with self.assertLogs("corral", "WARNING") as logs:
            for t in calls:
                t.start()
            until(lambda: self.c._lock.locked() and c2._lock.locked(), "both calls in flight")
            time.sleep(0.2)
            handover(before)
            self.assertEqual(got, {}, "a call ended at the handover")
            open(go, "w").close()
            for t in calls:
                t.join(60)
        self.assertIsInstance(got.get("wait"), corral.Record, got)
        self.assertEqual((got["wait"].state, got["wait"].outcome, got["wait"].exit_code), ("cleaned", "exited", 5))
        self.assertIsInstance(got.get("output"), corral.Output, got)
        self.assertEqual(got["output"].data, b"late\n")
        said = "\n".join(logs.output)
        self.assertIn(f"connection to corrald lost (restart or reload?); reconnected, waiting for {rec.id} on", said)
        self.assertIn(f"reconnected, waiting for {rec.id}'s stdout on", said)

    def test_wait_gives_up_when_corrald_does_not_come_back(self):
        proxy = DropProxy(SOCKET)
        self.addCleanup(proxy.close)
        c = corral.Client(proxy.path)
        self.addCleanup(c.close)
        saved = corral._calls.RESUME_FOR
        corral._calls.RESUME_FOR = 1.0
        self.addCleanup(setattr, corral._calls, "RESUME_FOR", saved)
        rec = self.start(["sleep", "30"])

        def close_when_in_flight():
            until(c._lock.locked, "wait in flight")
            time.sleep(0.2)
            proxy.close()  # the socket goes away for good

        t = threading.Thread(target=close_when_in_flight)
        t.start()
        self.addCleanup(t.join)
        with self.assertRaises(corral.ConnectionClosed) as cm:
            c.wait(rec.id)
        self.assertIn(f"exec.wait {rec.id}: ", str(cm.exception))
        self.assertIn("; not reconnected: for 1s: connect to corrald at " + proxy.path, str(cm.exception))
        self.assertEqual(self.c.get(rec.id).state, "running", "the execution is not the connection")

    # run

    def test_run(self):
        r = corral.run(["sh", "-c", "echo hi; echo there >&2; exit 3"], socket=SOCKET, timeout_ms=10000)
        self.assertIsInstance(r, corral.Result)
        self.assertEqual((r.exit_code, r.outcome, r.ok), (3, "exited", False))
        self.assertEqual((r.stdout, r.stderr), (b"hi\n", b"there\n"))
        self.assertTrue(corral.run(["true"], socket=SOCKET).ok)

    def test_run_timeout(self):
        r = self.c.run(["sleep", "30"], timeout_ms=200, grace_ms=100)
        self.assertEqual(r.outcome, "timeout")

    def test_corrald_not_running(self):
        d = tempfile.mkdtemp(prefix="corral-pynone-")
        self.addCleanup(shutil.rmtree, d, True)
        missing = os.path.join(d, "none.sock")
        with self.assertRaises(corral.ConnectionClosed) as cm:
            corral.Client(missing)
        self.assertIn(missing, str(cm.exception))
        with self.assertRaises(corral.ConnectionClosed):
            asyncio.run(aio.connect(missing))

    def test_argv_must_be_a_list(self):
        with self.assertRaises(TypeError):
            self.c.start("echo hi")

    # errors by code

    def test_errors_by_code(self):
        cases = [
            ("not found", lambda: self.c.get("no-such-id"), corral.NOT_FOUND),
            ("empty argv", lambda: self.c.start([]), corral.INVALID_PARAMS),
            ("bad signal", lambda: self.c.signal(self.start(["sleep", "30"]).id, "SIGNOPE"), corral.INVALID_PARAMS),
            ("bad stream", lambda: self.c.output("x", stream="stdin"), corral.INVALID_PARAMS),
            ("bad state", lambda: self.c.list(state="sleeping"), corral.INVALID_PARAMS),
            ("unknown method", lambda: self.c.call("exec.nope"), corral.METHOD_NOT_FOUND),
            ("write to a finished one", lambda: self.c.write(self.c.wait(self.start(["true"]).id).id, "x"), corral.INVALID_PARAMS),
            ("cancel unknown", lambda: self.c.cancel("no-such-id"), corral.NOT_FOUND),
        ]
        for name, f, code in cases:
            with self.subTest(name):
                with self.assertRaises(corral.CorralError) as cm:
                    f()
                self.assertEqual(cm.exception.code, code, cm.exception.message)
                self.assertTrue(cm.exception.message)
        # The connection survives errors.
        self.assertTrue(self.c.info().version)

    def test_over_capacity(self):
        cap = int(os.environ.get("CORRAL_TEST_MAX_PER_UID", "0"))
        self.assertGreater(cap, 0, "CORRAL_TEST_MAX_PER_UID is not set")
        lab = label()
        with self.assertRaises(corral.CorralError) as cm:
            for _ in range(cap + 1):
                self.start(["sleep", "30"], labels=lab)
        self.assertEqual(cm.exception.code, corral.OVER_CAPACITY)
        self.assertLessEqual(len(self.c.list(labels=lab)), cap, "nothing started past the cap")

    def test_request_over_the_line_limit(self):
        with self.assertRaises(corral.CorralError) as cm:
            self.c.start(["echo", "x" * (2 << 20)])
        self.assertEqual(cm.exception.code, corral.INVALID_REQUEST)
        self.assertTrue(self.c.info().version)

    def test_non_utf8_argument_is_refused(self):
        # A str holding undecodable bytes (os.fsdecode) cannot travel as
        # text: refused before it is sent, not run with U+FFFD in its place.
        with self.assertRaises(corral.CorralError) as cm:
            self.c.start(["printf", "%s", os.fsdecode(b"a\xffb")])
        self.assertEqual(cm.exception.code, corral.INVALID_PARAMS)
        self.assertIn("not valid UTF-8", str(cm.exception))
        r = self.c.run(["printf", "%s", "h\u00e9llo \u2603"])
        self.assertEqual(r.stdout, "h\u00e9llo \u2603".encode())

    def test_permission_denied_for_another_user(self):
        user = os.environ.get("CORRAL_TEST_USER")
        self.assertTrue(user, "CORRAL_TEST_USER is not set")
        # A copy of the package the user can read, wherever the repo is.
        d = tempfile.mkdtemp(prefix="corral-pyuser-")
        self.addCleanup(shutil.rmtree, d, True)
        os.chmod(d, 0o755)
        shutil.copytree(os.path.join(os.path.dirname(HERE), "corral"), os.path.join(d, "corral"))
        for root, dirs, files in os.walk(d):
            for x in dirs + files:
                os.chmod(os.path.join(root, x), 0o755)
        own = self.start(["sleep", "30"])
        code = (
            "import corral, sys\n"
            "c = corral.Client()\n"
            "def code(f):\n"
            "    try: f(); return 0\n"
            "    except corral.CorralError as e: return e.code\n"
            f"print(code(lambda: c.start(['true'], user='root')), code(lambda: c.get({own.id!r})),"
            f" code(lambda: c.cancel({own.id!r})), len([r for r in c.list() if r.id == {own.id!r}]))\n"
        )
        out = subprocess.run(
            ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", sys.executable, "-c", code],
            env={"CORRAL_SOCKET": SOCKET, "PYTHONPATH": d, "PATH": "/usr/bin:/bin"}, cwd="/",
            capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), [str(corral.PERMISSION_DENIED), str(corral.NOT_FOUND), str(corral.NOT_FOUND), "0"])
        self.assertEqual(self.c.get(own.id).state, "running", "another user's cancel left it running")


class AsyncClientTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(SOCKET, "CORRAL_SOCKET is not set: run these tests through tests/pyclient (make test)")

    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, 60))

    def test_run_and_concurrent_calls(self):
        async def main():
            r = await aio.run(["sh", "-c", "echo hi; exit 2"], socket=SOCKET)
            self.assertEqual((r.stdout, r.exit_code), (b"hi\n", 2))
            async with aio.AsyncClient(SOCKET) as c:
                recs = await asyncio.gather(*(c.start(["sh", "-c", f"echo {i}"]) for i in range(8)))
                done = await asyncio.gather(*(c.wait(x.id) for x in recs))
                self.assertEqual([d.exit_code for d in done], [0] * 8)
                outs = await asyncio.gather(*(c.output(x.id) for x in recs))
                self.assertEqual([o.data for o in outs], [b"%d\n" % i for i in range(8)])
                self.assertTrue((await c.info()).version)
        self.run_async(main())

    def test_every_method(self):
        async def main():
            async with aio.AsyncClient(SOCKET) as c:
                lab = label()
                rec = await c.start(["cat"], stdin_open=True, labels=lab)
                self.assertEqual((await c.get(rec.id)).id, rec.id)
                self.assertEqual(await c.write(rec.id, "abc"), 3)
                o = await c.output(rec.id, wait_ms=10000)
                self.assertEqual(o.data, b"abc")
                self.assertEqual([r.id for r in await c.list(labels=lab)], [rec.id])
                up = await c.update(rec.id, 60000)
                self.assertTrue(up.deadline)
                await c.signal(rec.id, "SIGTERM")
                done = await c.wait(rec.id, timeout_ms=20000)
                self.assertEqual(done.signal, "SIGTERM")
                self.assertEqual((await c.cancel(rec.id)).id, rec.id)
                t = await c.start(["sh", "-c", "read x; stty size"], tty=True)
                await c.resize(t.id, 30, 90)
                await c.write(t.id, "\n")
                await c.wait(t.id, timeout_ms=20000)
                self.assertIn(b"30 90", (await c.output(t.id)).data)
        self.run_async(main())

    def test_errors_by_code(self):
        async def main():
            async with aio.AsyncClient(SOCKET) as c:
                with self.assertRaises(corral.CorralError) as cm:
                    await c.get("no-such-id")
                self.assertEqual(cm.exception.code, corral.NOT_FOUND)
                with self.assertRaises(corral.CorralError) as cm:
                    await c.start([])
                self.assertEqual(cm.exception.code, corral.INVALID_PARAMS)
        self.run_async(main())

    def test_follow_resumes_after_dropped_connection(self):
        proxy = DropProxy(SOCKET)
        self.addCleanup(proxy.close)

        async def main():
            async with aio.AsyncClient(proxy.path) as c:
                rec = await c.start(["sh", "-c", "for i in $(seq 1 30); do echo line $i; sleep 0.05; done"])
                out = b""
                dropped = False
                kinds = []
                async for ev in c.follow(rec.id):
                    kinds.append(type(ev).__name__)
                    if isinstance(ev, corral.OutputEvent):
                        self.assertEqual(ev.offset, len(out))
                        out += ev.data
                        if not dropped and out.count(b"\n") >= 5:
                            proxy.drop_all()
                            dropped = True
                self.assertTrue(dropped)
                self.assertEqual(kinds[-1], "EndEvent")
                self.assertEqual(out, b"".join(b"line %d\n" % i for i in range(1, 31)))
        with self.assertLogs("corral", "WARNING") as logs:
            self.run_async(main())
        self.assertEqual(len(logs.output), 1, logs.output)

    def test_wait_and_output_across_a_corrald_handover(self):
        go = os.path.join(tempfile.mkdtemp(prefix="corral-pygo-"), "go")
        self.addCleanup(shutil.rmtree, os.path.dirname(go), True)
        before = started_at()
        sc = corral.Client(SOCKET)
        self.addCleanup(sc.close)
        rec = sc.start(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo late; exit 5"])
        self.addCleanup(lambda: sc.wait(sc.cancel(rec.id).id, timeout_ms=10000))

        async def main():
            async with aio.AsyncClient(SOCKET) as c:
                w = asyncio.ensure_future(c.wait(rec.id))
                o = asyncio.ensure_future(c.output(rec.id, wait_ms=50000))
                conn = c._conn
                while len(conn.pending) < 2:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)
                await asyncio.get_running_loop().run_in_executor(None, handover, before)
                self.assertFalse(w.done() or o.done(), "a call ended at the handover")
                open(go, "w").close()
                return await w, await o

        with self.assertLogs("corral", "WARNING") as logs:
            done, out = self.run_async(main())
        self.assertEqual((done.state, done.outcome, done.exit_code), ("cleaned", "exited", 5))
        self.assertEqual(out.data, b"late\n")
        said = "\n".join(logs.output)
        self.assertIn(f"connection to corrald lost (restart or reload?); reconnected, waiting for {rec.id} on", said)
        self.assertIn(f"reconnected, waiting for {rec.id}'s stdout on", said)


if __name__ == "__main__":
    unittest.main()
