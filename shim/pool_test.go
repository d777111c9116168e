package shim_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/shim"
)

// startPooled starts a pooled shim with no command yet.
func startPooled(t *testing.T) (*exec.Cmd, *shim.Handle) {
	t.Helper()
	return startPooledWith(t, shim.WrapPooled)
}

// startPooledWith is startPooled with WrapPooled or WrapPooledNetNS.
func startPooledWith(t *testing.T, wrap func(*exec.Cmd) (*shim.Handle, error)) (*exec.Cmd, *shim.Handle) {
	t.Helper()
	cmd := &exec.Cmd{}
	h, err := wrap(cmd)
	if err != nil {
		t.Fatalf("WrapPooled = %v", err)
	}
	t.Cleanup(func() { h.Close() })
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pooled shim: %v", err)
	}
	h.CloseChildEnds()
	return cmd, h
}

func TestPooledDispatch(t *testing.T) {
	cmd, h := startPooled(t)
	time.Sleep(100 * time.Millisecond) // it waits, with nothing to run
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	in, _ := os.Open(os.DevNull)
	defer in.Close()
	err = h.Dispatch(shim.Config{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 5"}, Env: []string{testPath}}, in, w, w)
	w.Close()
	if err != nil {
		t.Fatalf("Dispatch = %v", err)
	}
	if rep, err := h.WaitExec(10 * time.Second); rep != nil || err != nil {
		t.Fatalf("WaitExec = %+v, %v", rep, err)
	}
	var out bytes.Buffer
	out.ReadFrom(r)
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 5 || out.String() != "out\nerr\n" {
		t.Errorf("exit %d (%v), output %q; want 5 and both streams", code, err, out.String())
	}
	if err := h.Dispatch(shim.Config{Argv: []string{"true"}}, in, in, in); err == nil {
		t.Error("a second Dispatch succeeded")
	}
}

// TestPooledCreds: a pooled shim, whose runtime has had time to start all
// its threads while it waited, runs the command as the user asked for,
// every id and the groups, as the kernel shows them.
func TestPooledCreds(t *testing.T) {
	needRoot(t)
	cmd, h := startPooled(t)
	time.Sleep(50 * time.Millisecond)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	in, _ := os.Open(os.DevNull)
	defer in.Close()
	err = h.Dispatch(shim.Config{
		Argv: []string{"grep", "-E", "^(Uid|Gid|Groups):", "/proc/self/status"}, Env: []string{testPath},
		SetCreds: true, UID: 65534, GID: 65533, Groups: []uint32{65533, 65532},
	}, in, w, w)
	w.Close()
	if err != nil {
		t.Fatalf("Dispatch = %v", err)
	}
	if rep, err := h.WaitExec(10 * time.Second); rep != nil || err != nil {
		t.Fatalf("WaitExec = %+v, %v", rep, err)
	}
	var out bytes.Buffer
	out.ReadFrom(r)
	cmd.Wait()
	want := "Uid:\t65534\t65534\t65534\t65534\nGid:\t65533\t65533\t65533\t65533\nGroups:\t65532 65533 \n"
	if code := cmd.ProcessState.ExitCode(); code != 0 || out.String() != want {
		t.Errorf("exit %d, /proc status %q; want 0 and %q", code, out.String(), want)
	}
}

func TestPooledExecFailureAndNetns(t *testing.T) {
	needRoot(t)
	cmd1, h := startPooled(t)
	in, _ := os.Open(os.DevNull)
	defer in.Close()
	if err := h.Dispatch(shim.Config{Argv: []string{"no-such-corral-cmd"}, Env: []string{testPath}, NewNetNS: true, LoopbackUp: true}, in, in, in); err != nil {
		t.Fatal(err)
	}
	rep, err := h.WaitExec(10 * time.Second)
	if err != nil || rep == nil || !rep.NotFound() {
		t.Errorf("WaitExec = %+v, %v; want a not-found report", rep, err)
	}
	cmd1.Wait()

	cmd, h2 := startPooled(t)
	r, w, _ := os.Pipe()
	defer r.Close()
	if err := h2.Dispatch(shim.Config{Argv: []string{"cat", "/proc/net/dev"}, Env: []string{testPath}, NewNetNS: true, LoopbackUp: true}, in, w, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var out bytes.Buffer
	out.ReadFrom(r)
	cmd.Wait()
	if !strings.Contains(out.String(), "lo:") {
		t.Errorf("/proc/net/dev in the new netns has no lo:\n%s", out.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if name, _, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && name != "lo" && !strings.Contains(name, "|") {
			t.Errorf("interface %q visible in the new network namespace", name)
		}
	}
}

func TestPooledCloseWithoutDispatch(t *testing.T) {
	cmd, h := startPooled(t)
	h.Close()
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != shim.ExitParentGone {
		t.Errorf("undispatched pooled shim exit = %d, want %d", code, shim.ExitParentGone)
	}
}

// TestPooledPreNetNS: a pooled shim that made its network namespace while
// it waited (WrapPooledNetNS) runs a network "none" command there, with lo
// up and nothing else, and a host-network command in the host's namespace.
func TestPooledPreNetNS(t *testing.T) {
	needRoot(t)
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	in, _ := os.Open(os.DevNull)
	defer in.Close()
	run := func(cfg shim.Config) string {
		t.Helper()
		cmd, h := startPooledWith(t, shim.WrapPooledNetNS)
		time.Sleep(50 * time.Millisecond) // it makes the namespace while it waits
		r, w, _ := os.Pipe()
		defer r.Close()
		cfg.Env = []string{testPath}
		if err := h.Dispatch(cfg, in, w, w); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if rep, err := h.WaitExec(10 * time.Second); rep != nil || err != nil {
			t.Fatalf("WaitExec = %+v, %v", rep, err)
		}
		var out bytes.Buffer
		out.ReadFrom(r)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: %v\n%s", cfg.Argv, err, out.String())
		}
		return out.String()
	}
	script := "readlink /proc/self/ns/net; cat /proc/net/dev; grep -c 127.0.0.1 /proc/net/fib_trie || true"
	none := run(shim.Config{Argv: []string{"sh", "-c", script}, NewNetNS: true, LoopbackUp: true})
	ns, rest, _ := strings.Cut(none, "\n")
	if ns == host {
		t.Errorf("network none command in the host's network namespace %s", ns)
	}
	for _, l := range strings.Split(rest, "\n") {
		if name, _, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && name != "lo" && !strings.Contains(name, "|") {
			t.Errorf("interface %q visible in the new network namespace", name)
		}
	}
	if lines := strings.Split(strings.TrimSpace(rest), "\n"); lines[len(lines)-1] == "0" {
		t.Errorf("lo is not up in the new network namespace (no 127.0.0.1 route):\n%s", none)
	}
	hostNet := run(shim.Config{Argv: []string{"readlink", "/proc/self/ns/net"}})
	if got := strings.TrimSpace(hostNet); got != host {
		t.Errorf("host-network command in network namespace %s, want the host's %s", got, host)
	}
}

// TestPooledErrorPipeTellsWhetherItRan: a corrald that dies mid-dispatch
// leaves its successor a copy of the pooled shim's error pipe (parked in
// the fd store). Read there after the shim is done: a shim that got no
// command reports shim.OpParentGone (and exits ExitParentGone); one that
// exec'd its command leaves EOF and no report.
func TestPooledErrorPipeTellsWhetherItRan(t *testing.T) {
	keep := func(h *shim.Handle) int {
		fd, err := unix.FcntlInt(uintptr(h.ErrFD()), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	readDone := func(fd int) (*shim.ExecError, error) {
		for deadline := time.Now().Add(10 * time.Second); ; {
			rep, err := shim.ReadExecError(fd)
			if err != shim.ErrPending || time.Now().After(deadline) {
				return rep, err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	cmd, h := startPooled(t)
	fd := keep(h)
	h.Close() // as corrald's death closes the dispatch socket
	cmd.Wait()
	rep, err := readDone(fd)
	if err != nil || rep == nil || rep.Op != shim.OpParentGone {
		t.Errorf("no command dispatched: read %+v, %v; want a %q report", rep, err, shim.OpParentGone)
	}
	if code := cmd.ProcessState.ExitCode(); code != shim.ExitParentGone {
		t.Errorf("no command dispatched: exit %d, want %d", code, shim.ExitParentGone)
	}

	cmd, h = startPooled(t)
	fd = keep(h)
	in, _ := os.Open(os.DevNull)
	defer in.Close()
	if err := h.Dispatch(shim.Config{Argv: []string{"sh", "-c", "exit 125"}, Env: []string{testPath}}, in, in, in); err != nil {
		t.Fatal(err)
	}
	h.Close()
	cmd.Wait()
	if rep, err := readDone(fd); rep != nil || err != nil {
		t.Errorf("command exec'd (it exits 125 too): read %+v, %v; want EOF, no report", rep, err)
	}
}
