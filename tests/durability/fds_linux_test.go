package durability

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"
)

// TestChildHoldsNoDaemonFd: a child corrald starts directly (root, host
// network, no shim) holds only its stdio: not an fd corrald inherited
// without close-on-exec (here a pipe its parent leaked as fd 3), and, after
// a handover (SIGHUP: the old image passes the listening socket and every
// execution's fds to the new one without close-on-exec), not one of those
// either. A child holding the listener could accept connections meant for
// corrald.
func TestChildHoldsNoDaemonFd(t *testing.T) {
	for _, backend := range []string{"cgroup", "pgroup"} {
		t.Run(backend, func(t *testing.T) { testChildFds(t, backend) })
	}
}

func testChildFds(t *testing.T, backend string) {
	e := newEnv(t, "")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	d := testd.Start(t, testd.Config{
		Corrald: binDir + "/corrald",
		Socket:  e.socket, StateDir: e.state, CgroupBase: e.base,
		LogPath:    e.dir + "/corrald-fds.log",
		Args:       []string{"--scope", backend, "--socket-group", ""},
		ExtraFiles: []*os.File{w}, // fd 3 in corrald, inheritable
	})
	c := d.Client()
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	// One running across the handover, so that it hands over its fds too.
	long, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "60"}, Cwd: "/", TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c := d.Client()
		c.Cancel(ctx(t), api.CancelParams{ID: long.ID})
		waitCleaned(t, c, long.ID)
	}()
	onlyStdio(t, d.Pid(), long.PID, "started by the first image")
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
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "60"}, Cwd: "/", TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	onlyStdio(t, d.Pid(), rec.PID, "started after the handover")
	c.Cancel(ctx(t), api.CancelParams{ID: rec.ID})
	waitCleaned(t, c, rec.ID)
}

// onlyStdio fails t if process child holds, above its stdio, an fd that
// corrald (pid daemon) holds too, naming the file and corrald's fds for it.
// The child's own (sleep opens locale files as it starts) do not count.
func onlyStdio(t *testing.T, daemon, child int, what string) {
	t.Helper()
	ours := map[string]string{}
	dents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", daemon))
	for _, e := range dents {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", daemon, e.Name())); err == nil {
			ours[l] += " " + e.Name()
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", child)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("the child's fds: %v", err)
	}
	for _, e := range ents {
		if n, _ := strconv.Atoi(e.Name()); n <= 2 {
			continue
		}
		l, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || ours[l] == "" {
			continue
		}
		t.Errorf("a child %s holds fd %s: %s (corrald's fds:%s)", what, e.Name(), l, ours[l])
	}
}
