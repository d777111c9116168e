package cgroupv2

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatcher: one watcher serves several directories; a change of a
// watched file calls its directory's function only; after stop, and after
// Close, nothing is called.
func TestWatcher(t *testing.T) {
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	a, b := Dir(t.TempDir()), Dir(t.TempDir())
	for _, d := range []Dir{a, b} {
		writeFiles(t, string(d), map[string]string{"cgroup.events": "populated 1\n"})
	}
	calls := make(chan Dir, 16)
	stopA, err := w.Add(a, func() { calls <- a }, "cgroup.events", "memory.events")
	if err != nil {
		t.Fatalf("Add %s: %v (memory.events is missing, which is allowed)", a, err)
	}
	stopB, err := w.Add(b, func() { calls <- b }, "cgroup.events")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Add(Dir(t.TempDir()), func() {}, "cgroup.events"); err == nil {
		t.Error("Add of a directory without its first file succeeded")
	}
	expect := func(want Dir) {
		t.Helper()
		select {
		case got := <-calls:
			if got != want {
				t.Errorf("change of %s called the function of %s", want, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no call within 10s for a change of %s", want)
		}
		// A truncating write may be two modifications.
		for {
			select {
			case got := <-calls:
				if got != want {
					t.Errorf("change of %s called the function of %s", want, got)
				}
			case <-time.After(50 * time.Millisecond):
				return
			}
		}
	}
	quiet := func() {
		t.Helper()
		select {
		case got := <-calls:
			t.Errorf("unexpected call for %s", got)
		case <-time.After(100 * time.Millisecond):
		}
	}
	write := func(d Dir) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(string(d), "cgroup.events"), []byte("populated 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(b)
	expect(b)
	write(a)
	expect(a)
	stopA()
	stopA() // idempotent
	write(a)
	quiet()
	write(b)
	expect(b)
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	write(b)
	quiet()
	stopB() // after Close: no effect, no panic
	if _, err := w.Add(a, func() {}, "cgroup.events"); err == nil {
		t.Error("Add after Close succeeded")
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
