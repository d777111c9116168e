package survival

import (
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/harness"
)

// TestTerminalSurvivesKill9: a shell on a terminal across a kill -9 of
// corrald under systemd. Its pty master comes back from the fd store (fd
// role "pty"); the shell answers typed input after the restart, and the
// end of input (close) ends it with exit code 0, adopted once.
func TestTerminalSurvivesKill9(t *testing.T) {
	setup(t)
	c := dial(t)
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-i"}, TTY: true, TimeoutMS: 90000,
		Env: map[string]string{"PS1": "corral$ "}})
	if err != nil {
		t.Fatal(err)
	}
	var off int64
	off = expectOutput(t, c, rec.ID, off, "corral$ ")
	if _, err := c.Write(ctx(t), api.WriteParams{ID: rec.ID, Data: []byte("echo before-$((1+1))\n")}); err != nil {
		t.Fatal(err)
	}
	off = expectOutput(t, c, rec.ID, off, "before-2\r\ncorral$ ")

	old := mainPID(t)
	harness.Sh(t, "systemctl", "kill", "--signal=SIGKILL", "--kill-who=main", "corrald.service")
	c = waitNewMain(t, old)
	if _, err := c.Write(ctx(t), api.WriteParams{ID: rec.ID, Data: []byte("echo after-$((2+2))\n")}); err != nil {
		t.Fatalf("exec.write to the terminal after the restart: %v\n%s", err, journalTail())
	}
	expectOutput(t, c, rec.ID, off, "after-4\r\n")
	if _, err := c.Write(ctx(t), api.WriteParams{ID: rec.ID, Close: true}); err != nil {
		t.Fatal(err)
	}
	final, err := c.Wait(ctx(t), api.WaitParams{ID: rec.ID})
	if err != nil {
		t.Fatal(err)
	}
	if outcome(final) != "exited" || final.ExitCode == nil || *final.ExitCode != 0 || final.Adopted != 1 || !final.TTY {
		t.Errorf("terminal execution after kill -9: outcome %s exit %v adopted %d tty %v error %s; want exited 0, adopted 1",
			outcome(final), final.ExitCode, final.Adopted, final.TTY, strOr(final.Error))
	}
}

// expectOutput reads id's stdout from off (exec.output wait_ms) until what
// it read contains want; it returns the offset after it.
func expectOutput(t *testing.T, c *ipc.Client, id string, off int64, want string) int64 {
	t.Helper()
	var got strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		res, err := c.Output(ctx(t), api.OutputParams{ID: id, Offset: off, WaitMS: 1000})
		if err != nil {
			t.Fatalf("exec.output: %v", err)
		}
		got.Write(res.Data)
		off = res.NextOffset
		if strings.Contains(got.String(), want) {
			return off
		}
		if res.EOF {
			break
		}
	}
	t.Fatalf("output %q does not contain %q\n%s", got.String(), want, journalTail())
	return off
}
