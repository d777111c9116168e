package cgroupv2

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestAtReadsAsDir: a cgroup read relative to its base's descriptor (At)
// reports what the same cgroup read by path (Dir) does: a file longer than
// At's buffer, a key on the last line without a newline, "max", and after
// the base is closed (by path then) and once the cgroup is gone.
func TestAtReadsAsDir(t *testing.T) {
	base := t.TempDir()
	filler := strings.Repeat("low 0\n", 120) // 720 bytes, past At's buffer
	writeFiles(t, filepath.Join(base, "c"), map[string]string{
		"cpu.stat":      "usage_usec 30\nuser_usec 20\nsystem_usec 10\nnr_periods 0\n",
		"cgroup.events": "populated 1\nfrozen 0\n",
		"memory.peak":   "4096\n",
		"memory.events": filler + "oom_kill 2",
		"pids.current":  "3\n",
		"pids.peak":     "max\n",
	})
	b, err := OpenBase(Dir(base))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	at, d := b.At("c"), Dir(base).Child("c")
	want := Stats{30000, 20000, 10000, 4096, Unknown, 3, 2}
	check := func(when string) {
		t.Helper()
		st, err := at.StatsOf(true, true)
		dst, derr := d.StatsOf(true, true)
		if err != nil || derr != nil || st != want || dst != want {
			t.Errorf("%s: At.StatsOf = %+v, %v; Dir.StatsOf = %+v, %v; want %+v", when, st, err, dst, derr, want)
		}
		if e, err := at.Empty(); e || err != nil {
			t.Errorf("%s: At.Empty = %v, %v, want false (populated 1)", when, e, err)
		}
		if n := at.Count("pids.current"); n != 3 {
			t.Errorf("%s: At.Count(pids.current) = %d, want 3", when, n)
		}
	}
	check("by the base's fd")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	check("base closed")
	if err := os.RemoveAll(string(d)); err != nil {
		t.Fatal(err)
	}
	if _, err := at.StatsOf(true, true); !Gone(err) {
		t.Errorf("At.StatsOf of a removed cgroup = %v, want an error satisfying Gone", err)
	}
	if e, err := at.Empty(); !e || err != nil {
		t.Errorf("At.Empty of a removed cgroup = %v, %v, want true (empty)", e, err)
	}
}

// TestAtReadsOnForWhatIsWanted: a read that comes back short is the whole
// file only when it ends a line and holds every key wanted; else At reads
// on to EOF. The files here are FIFOs written in two parts, the second once
// the first was read, so the first read is short.
func TestAtReadsOnForWhatIsWanted(t *testing.T) {
	for _, tt := range []struct {
		name         string
		first, after string
		want         Stats
	}{
		{"key in the second part", "usage_usec 30\nuser_usec 20\n", "system_usec 10\n",
			Stats{30000, 20000, 10000, Unknown, Unknown, Unknown, Unknown}},
		{"a line cut", "usage_usec 30\nuser_usec 20\nsystem_usec 1", "0\n",
			Stats{30000, 20000, 10000, Unknown, Unknown, Unknown, Unknown}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			if err := os.Mkdir(filepath.Join(base, "c"), 0o755); err != nil {
				t.Fatal(err)
			}
			fifo := filepath.Join(base, "c", "cpu.stat")
			if err := unix.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- writeInParts(fifo, tt.first, tt.after) }()
			b, err := OpenBase(Dir(base))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			st, err := b.At("c").StatsOf(false, false)
			if werr := <-done; werr != nil {
				t.Fatal(werr)
			}
			if err != nil || st != tt.want {
				t.Errorf("StatsOf = %+v, %v, want %+v", st, err, tt.want)
			}
		})
	}
}

// writeInParts opens the FIFO path, writes first, waits until the reader
// has taken all of it, writes after and closes.
func writeInParts(path, first, after string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteString(first); err != nil {
		return err
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		var n int
		var ierr error
		if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the reader left %d bytes of the first part", n)
		}
	}
	_, err = f.WriteString(after)
	return err
}
