package durability

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// A terminal execution and a deadline moved with exec.update survive a
// handover: the shell on the terminal still answers typed input and ends
// with 0 on EOF, its output whole; the moved deadline (not the original
// timeout_ms) ends the other one.
func TestHandoverKeepsTerminalAndMovedDeadline(t *testing.T) {
	e := newEnv(t, "")
	d := e.start()
	c := d.Client()
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	term, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-i"}, TTY: true, Cwd: "/", TimeoutMS: 60000,
		Env: map[string]string{"PS1": "corral$ "}})
	if err != nil {
		t.Fatal(err)
	}
	long, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "100"}, Cwd: "/", TimeoutMS: 100000})
	if err != nil {
		t.Fatal(err)
	}
	ms := int64(3000)
	up, err := c.Update(ctx(t), api.UpdateParams{ID: long.ID, TimeoutMS: &ms})
	if err != nil || up.Deadline == nil {
		t.Fatalf("exec.update = %v, %v", up.Deadline, err)
	}
	waitOutput(t, c, term.ID, "corral$ ") // typed before the prompt, the echo would come first
	if _, err := c.Write(ctx(t), api.WriteParams{ID: term.ID, Data: []byte("echo one-$((1+1))\n")}); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, c, term.ID, "one-2")

	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new image to answer daemon.info", func() bool {
		c2, err := ipc.Dial(d.Socket)
		if err != nil {
			return false
		}
		defer c2.Close()
		info, err := c2.Info(ctx(t))
		return err == nil && info.StartedAt.After(before.StartedAt)
	})
	c = d.Client()
	if _, err := c.Write(ctx(t), api.WriteParams{ID: term.ID, Data: []byte("echo two-$((2+2))\n")}); err != nil {
		t.Fatalf("exec.write to the terminal after the handover: %v", err)
	}
	waitOutput(t, c, term.ID, "two-4")
	if _, err := c.Resize(ctx(t), api.ResizeParams{ID: term.ID, Rows: 40, Cols: 100}); err != nil {
		t.Fatalf("exec.resize after the handover: %v", err)
	}
	if _, err := c.Write(ctx(t), api.WriteParams{ID: term.ID, Data: []byte("stty size\n")}); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, c, term.ID, "40 100")
	if _, err := c.Write(ctx(t), api.WriteParams{ID: term.ID, Close: true}); err != nil {
		t.Fatal(err)
	}
	rec := waitCleaned(t, c, term.ID)
	if outcomeOf(rec) != "exited" || rec.ExitCode == nil || *rec.ExitCode != 0 || rec.Adopted != 1 || !rec.TTY {
		t.Errorf("terminal execution: outcome %s exit %v adopted %d tty %v error %s; want exited 0, adopted 1", outcomeOf(rec), rec.ExitCode, rec.Adopted, rec.TTY, strOr(rec.Error, ""))
	}
	out := joined(readAll(t, c, term.ID, "stdout"))
	for _, want := range []string{"corral$ echo one-$((1+1))\r\none-2\r\n", "two-4\r\n", "40 100\r\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal output %q lacks %q", out, want)
		}
	}
	rec = waitCleaned(t, c, long.ID)
	if outcomeOf(rec) != "timeout" || rec.ExitedAt == nil || rec.ExitedAt.After(up.Deadline.Add(10*time.Second)) {
		t.Errorf("moved deadline after the handover: outcome %s exited %v; want timeout at about %v", outcomeOf(rec), rec.ExitedAt, up.Deadline)
	}
}

// waitOutput waits until id's stdout contains want (exec.output wait_ms).
func waitOutput(t *testing.T, c *ipc.Client, id, want string) {
	t.Helper()
	var got strings.Builder
	var off int64
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		res, err := c.Output(ctx(t), api.OutputParams{ID: id, Offset: off, WaitMS: 1000})
		if err != nil {
			t.Fatalf("exec.output: %v", err)
		}
		got.Write(res.Data)
		off = res.NextOffset
		if strings.Contains(got.String(), want) {
			return
		}
		if res.EOF {
			break
		}
	}
	t.Fatalf("output %q does not contain %q", got.String(), want)
}
