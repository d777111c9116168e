package reactor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/testenv"
)

// mountSmallTmpfs mounts a tmpfs of size on a fresh directory, unmounted
// at the test's end (after the reactors' cleanups, which are registered
// later).
func mountSmallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		testenv.Skipf(t, "cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v; detaching it", dir, err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

// fillUp writes a file in dir until its file system is full.
func fillUp(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{'z'}, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return
		}
	}
}

// fullDiskScript writes a first line, waits for its gate file, then writes
// more than a page (so a spool on a full tmpfs cannot take it) and a last
// line.
const fullDiskScript = `echo first; while [ ! -e "$0" ]; do sleep 0.01; done; head -c 20000 /dev/zero | tr '\0' y; echo; echo last; exit 3`

var fullDiskOutput = "first\n" + strings.Repeat("y", 20000) + "\nlast\n"

// TestSpoolOnAFullDiskKeepsOutput: when the spool's file system fills up
// the spool is abandoned and the stream read as before: the child's later
// output is kept (in memory, and in the store with the exited record). The
// failed splice into the spool was taken for a read error of the pipe,
// which closed the stream under the child (SIGPIPE at its next write).
func TestSpoolOnAFullDiskKeepsOutput(t *testing.T) {
	writeExitsAtOnce(t)
	dir := mountSmallTmpfs(t, "256k")
	gate := filepath.Join(t.TempDir(), "go")
	tr := newTestReactor(t, func(c *Config) {
		c.Store, c.FdStore, c.StateDir = store.NewMemory(), &fakeFdStore{fds: map[string]int{}}, dir
	})
	rec, err := tr.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", fullDiskScript, gate}})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, tr.Reactor, rec.ID, "first\n")
	fillUp(t, dir)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := tr.wait(rec.ID)
	if outcome(got) != api.OutcomeExited || got.ExitCode == nil || *got.ExitCode != 3 {
		t.Errorf("outcome %s exit %v signal %v, want exited 3", outcome(got), got.ExitCode, got.Signal)
	}
	if out := tr.stdout(rec.ID); out != fullDiskOutput {
		t.Errorf("stdout %d bytes (%.20q...), want %d", len(out), out, len(fullDiskOutput))
	}
}
