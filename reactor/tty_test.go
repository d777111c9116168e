package reactor

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// term drives a terminal execution: it types with exec.write and reads the
// terminal's output (stdout) with exec.output wait_ms.
type term struct {
	tr  *testReactor
	id  string
	off int64
	buf string // read, not yet consumed by expect
}

func (tm *term) typeIn(s string) {
	tm.tr.t.Helper()
	w, err := tm.tr.Write(context.Background(), root, api.WriteParams{ID: tm.id, Data: []byte(s)})
	if err != nil || w.Written != len(s) {
		tm.tr.t.Fatalf("Write(%q) = %d, %v", s, w.Written, err)
	}
}

// expect reads until the unconsumed output contains want, and consumes
// it up to want's end, which it returns.
func (tm *term) expect(want string) string {
	tm.tr.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if i := strings.Index(tm.buf, want); i >= 0 {
			got := tm.buf[:i+len(want)]
			tm.buf = tm.buf[i+len(want):]
			return got
		}
		if time.Now().After(deadline) {
			break
		}
		res, err := tm.tr.Output(context.Background(), root, api.OutputParams{ID: tm.id, Offset: tm.off, WaitMS: 2000})
		if err != nil {
			tm.tr.t.Fatalf("Output: %v", err)
		}
		tm.buf += string(res.Data)
		tm.off = res.NextOffset
		if res.EOF && len(res.Data) == 0 {
			break
		}
	}
	tm.tr.t.Fatalf("terminal output %q does not contain %q", tm.buf, want)
	return ""
}

func TestTerminalShell(t *testing.T) {
	for _, pool := range []bool{false, true} {
		name := "direct"
		mod := func(*Config) {}
		if pool {
			name = "pooled shim"
			mod = func(c *Config) { c.PoolSize = 1 }
		}
		t.Run(name, func(t *testing.T) {
			// One reactor at a time: two subreapers in one process would
			// reap each other's children.
			tr := newTestReactor(t, mod)
			p := api.StartParams{Argv: []string{"sh", "-i"}, TTY: true, TTYSize: &api.TTYSize{Rows: 30, Cols: 90},
				Env: map[string]string{"PS1": "corral$ "}, TimeoutMS: 60000}
			if pool {
				// The pool serves commands that need a shim: another user.
				p.User = "nobody"
				for deadline := time.Now().Add(10 * time.Second); tr.pool.idleCount() == 0 && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
			}
			rec := tr.start(p)
			if !rec.TTY || rec.TTYSize == nil || *rec.TTYSize != (api.TTYSize{Rows: 30, Cols: 90}) {
				t.Fatalf("record tty %v size %v, want a 30x90 terminal", rec.TTY, rec.TTYSize)
			}
			tm := &term{tr: tr, id: rec.ID}
			tm.expect("corral$ ")
			tm.typeIn("echo $((6*7))\n")
			got := tm.expect("42")
			if !strings.Contains(got, "echo $((6*7))") {
				t.Errorf("typed input not echoed: %q", got)
			}
			tm.expect("corral$ ")
			tm.typeIn("stty size\n")
			tm.expect("30 90")
			tm.expect("corral$ ")
			if _, err := tr.Resize(context.Background(), root, api.ResizeParams{ID: rec.ID, Rows: 50, Cols: 132}); err != nil {
				t.Fatal(err)
			}
			tm.typeIn("stty size\n")
			tm.expect("50 132")
			tm.expect("corral$ ")
			tm.typeIn("for f in 0 1 2; do [ -t $f ] && echo isatty$f; done; echo done\n")
			tm.expect("isatty0\r\nisatty1\r\nisatty2\r\ndone")
			tm.expect("corral$ ")
			// The terminal is the caller's, group tty, 0620: as login(1)
			// leaves it, not writable by the caller's primary group.
			tm.typeIn("stat -c 'owner=%u:%G:%a' \"$(tty)\"\n")
			wantOwner := "owner=0:tty:620"
			if pool {
				wantOwner = "owner=65534:tty:620"
			}
			tm.expect(wantOwner)
			tm.expect("corral$ ")
			// Its own session, with the terminal as controlling terminal.
			// pid, session and tty_nr of the shell (/proc/PID/stat fields 1, 6, 7).
			tm.typeIn("cut -d' ' -f1,6,7 /proc/$$/stat\n")
			line := tm.expect("corral$ ")
			lines := strings.Split(strings.TrimSpace(line), "\r\n")
			if f := strings.Fields(lines[len(lines)-2]); len(f) != 3 || f[0] != f[1] || f[2] == "0" {
				t.Errorf("pid, session, tty_nr of the shell = %q, want a session leader with a controlling terminal", lines[len(lines)-2])
			}
			if pool && tr.pool.hits.Load() == 0 {
				t.Error("the pooled case did not go through the pool")
			}
			if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
				t.Fatal(err)
			}
			final := tr.wait(rec.ID)
			t.Logf("terminal output: %q", tr.stdout(rec.ID))
			if outcome(final) != api.OutcomeExited || *final.ExitCode != 0 {
				t.Fatalf("after close: outcome %s exit %v signal %v error %v, want exited 0", outcome(final), final.ExitCode, str(final.Signal), str(final.Error))
			}
			if final.Stderr.TotalBytes != 0 || final.Stdout.TotalBytes < 50 {
				t.Errorf("stdout %+v stderr %+v: want everything on stdout", final.Stdout, final.Stderr)
			}
		})
	}
}

func TestTerminalBackgroundChildIsKilled(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "sleep 1000 & echo $!"}, TTY: true})
	pid, err := strconv.Atoi(strings.TrimSpace(tr.stdout(rec.ID)))
	if err != nil {
		t.Fatalf("stdout %q: %v", tr.stdout(rec.ID), err)
	}
	// Cleaned means killed; an orphan may be a zombie for a moment until
	// the reaper's SIGCHLD handling reaps it.
	deadline := time.Now().Add(10 * time.Second)
	for unix.Kill(pid, 0) != unix.ESRCH {
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Fatalf("background sleep %d still exists 10s after cleaned: %s", pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if outcome(rec) != api.OutcomeExited {
		t.Fatalf("outcome %s", outcome(rec))
	}
}

func TestTerminalHundredMegabytes(t *testing.T) {
	tr := newTestReactor(t, nil)
	runtime.GC()
	before := vmRSS(t)
	rec := tr.run(api.StartParams{Argv: []string{"head", "-c", "100000000", "/dev/zero"}, TTY: true, TimeoutMS: 120000})
	after := vmRSS(t)
	if rec.Stdout.TotalBytes != 100000000 || rec.Stdout.KeptBytes != api.DefaultOutputLimitBytes || !rec.Stdout.Truncated {
		t.Errorf("stdout = %+v, want 100000000 counted, %d kept", rec.Stdout, api.DefaultOutputLimitBytes)
	}
	if outcome(rec) != api.OutcomeExited || *rec.ExitCode != 0 {
		t.Errorf("outcome %s", outcome(rec))
	}
	if grew := after - before; grew > 32<<20 {
		t.Errorf("RSS grew by %d MiB for 100 MB through a terminal, want < 32 MiB", grew>>20)
	}
}

func TestTerminalBadInput(t *testing.T) {
	tr := newTestReactor(t, nil)
	for _, sz := range []api.TTYSize{{Rows: 0, Cols: 80}, {Rows: 24, Cols: 0}, {Rows: -1, Cols: 80}, {Rows: 24, Cols: -3}, {Rows: 100000, Cols: 80}, {Rows: 24, Cols: 1 << 20}} {
		sz := sz
		_, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"true"}, TTY: true, TTYSize: &sz})
		wantCode(t, "Start(tty_size "+strconv.Itoa(sz.Rows)+"x"+strconv.Itoa(sz.Cols)+")", err, api.CodeInvalidParams)
		if !strings.Contains(err.Error(), "tty_size") {
			t.Errorf("error %q does not name tty_size", err)
		}
	}
	_, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"true"}, TTYSize: &api.TTYSize{Rows: 2, Cols: 2}})
	wantCode(t, "Start(tty_size without tty)", err, api.CodeInvalidParams)

	pipes := tr.start(api.StartParams{Argv: []string{"sleep", "30"}})
	defer tr.Cancel(context.Background(), root, api.CancelParams{ID: pipes.ID})
	_, err = tr.Resize(context.Background(), root, api.ResizeParams{ID: pipes.ID, Rows: 10, Cols: 10})
	wantCode(t, "Resize(no tty)", err, api.CodeInvalidParams)

	// A child that never reads: the terminal takes a few KiB, the daemon
	// queues a bounded amount more; the write answers with what it took.
	rec := tr.start(api.StartParams{Argv: []string{"sleep", "30"}, TTY: true})
	defer tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID})
	for _, sz := range []api.TTYSize{{Rows: 0, Cols: 1}, {Rows: 1, Cols: 100000}} {
		_, err := tr.Resize(context.Background(), root, api.ResizeParams{ID: rec.ID, Rows: sz.Rows, Cols: sz.Cols})
		wantCode(t, "Resize(bad size)", err, api.CodeInvalidParams)
	}
	flood := []byte(strings.Repeat("y", 1<<20))
	total := 0
	for range 4 {
		w, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: flood})
		if err != nil {
			t.Fatalf("Write(1 MiB) = %v", err)
		}
		total += w.Written
	}
	if total >= 1<<20 || total < 1 {
		t.Fatalf("a child that never reads took %d of 4 MiB typed, want a bounded part", total)
	}
	start := time.Now()
	if _, err := tr.Get(context.Background(), root, api.IDParams{ID: rec.ID}); err != nil {
		t.Fatal(err)
	}
	t.Logf("took %d bytes; exec.get after the flood answered in %v", total, time.Since(start))
	if time.Since(start) > 5*time.Second {
		t.Fatal("the loop is not responsive after a write flood")
	}
}

// python3 -i on a terminal: its prompt, isatty for 0, 1 and 2, the size
// after exec.resize as Python sees it, and EOF (close) ends it with 0.
func TestTerminalPython(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.start(api.StartParams{Argv: []string{"python3", "-i", "-q"}, TTY: true, TimeoutMS: 60000})
	tm := &term{tr: tr, id: rec.ID}
	tm.expect(">>> ")
	tm.typeIn("import os; print('tty', [os.isatty(i) for i in range(3)])\n")
	tm.expect("tty [True, True, True]")
	tm.expect(">>> ")
	if _, err := tr.Resize(context.Background(), root, api.ResizeParams{ID: rec.ID, Rows: 33, Cols: 111}); err != nil {
		t.Fatal(err)
	}
	tm.typeIn("print('size', tuple(os.get_terminal_size()))\n")
	tm.expect("size (111, 33)")
	tm.expect(">>> ")
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
		t.Fatal(err)
	}
	final := tr.wait(rec.ID)
	if outcome(final) != api.OutcomeExited || *final.ExitCode != 0 {
		t.Fatalf("after close: outcome %s exit %v signal %v error %v, want exited 0", outcome(final), final.ExitCode, str(final.Signal), str(final.Error))
	}
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}
