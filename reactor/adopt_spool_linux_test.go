package reactor

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// TestSpoolRebuildsKeptOutput: whatever was written, and however often the
// spool was compacted, the kept output read back from it is the one kept in
// memory: same total, same head, same tail.
func TestSpoolRebuildsKeptOutput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int64
		total int
	}{
		{"small, nothing dropped", 1 << 10, 300},
		{"exactly the limit", 1 << 10, 1 << 10},
		{"dropped, no compaction", 1 << 10, 64 << 10},
		{"compacted", 256 << 10, 5 << 20},
		{"no limit kept", 0, 3 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "e.stdout")
			k := newKeptOutput(tc.limit)
			sp, err := newSpool(path, int64(k.half))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewSource(1))
			for written := 0; written < tc.total; {
				chunk := make([]byte, min(1+rng.Intn(200<<10), tc.total-written))
				rng.Read(chunk)
				k.write(chunk)
				sp.write(chunk, k)
				written += len(chunk)
			}
			if sp.err != nil {
				t.Fatal(sp.err)
			}
			sp.close()
			got, ok, err := readSpool(path, tc.limit)
			if err != nil || !ok {
				t.Fatalf("readSpool: ok %v, %v", ok, err)
			}
			if got.total != k.total || !bytes.Equal(got.head, k.head) || !bytes.Equal(got.tailBytes(), k.tailBytes()) {
				t.Fatalf("rebuilt total %d head %d tail %d; want total %d head %d tail %d (tail equal %v)",
					got.total, len(got.head), len(got.tailBytes()), k.total, len(k.head), len(k.tailBytes()),
					bytes.Equal(got.tailBytes(), k.tailBytes()))
			}
			// Appending after a reopen goes on where the spool was.
			sp2, err := reopenSpool(path, got)
			if err != nil {
				t.Fatal(err)
			}
			more := []byte("after the restart")
			k.write(more)
			got.write(more)
			sp2.write(more, got)
			sp2.close()
			again, _, err := readSpool(path, tc.limit)
			if err != nil || again.total != k.total || !bytes.Equal(again.tailBytes(), k.tailBytes()) || !bytes.Equal(again.head, k.head) {
				t.Fatalf("after reopen: total %d want %d, err %v", again.total, k.total, err)
			}
		})
	}
}

// TestSpoolReadBackFailureIsNotEOF: when the bytes spliced into the spool
// cannot be read back (here a spool opened write-only), readOutput says so
// and reads the pipe plainly from then on; it used to answer (0, nil),
// which drain takes for the pipe's EOF: the stream was closed under a
// child still writing (SIGPIPE) and its later output lost.
func TestSpoolReadBackFailureIsNotEOF(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	path := filepath.Join(t.TempDir(), "e.stdout")
	wo, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wo)
	r := &Reactor{readBuf: make([]byte, 4096), log: zerolog.Nop()}
	s := &stream{name: "stdout", fd: p[0], kept: newKeptOutput(1024), spool: &spool{path: path, fd: wo, half: 512}}
	unix.Write(p[1], []byte("first"))
	n, err := r.readOutput(s)
	if n == 0 && err == nil {
		t.Fatal("readOutput answered (0, nil), drain's EOF, for a pipe still open after a failed read back")
	}
	if s.spool.err == nil {
		t.Error("the failed read back is not recorded on the spool")
	}
	unix.Write(p[1], []byte("second"))
	n, err = r.readOutput(s)
	if err != nil || string(r.readBuf[:n]) != "second" {
		t.Errorf("next read = %q, %v; want the pipe's later output read plainly", r.readBuf[:n], err)
	}
}

// TestAbandonedSpoolReadsAsLost: a spool abandoned after a failed write
// says so in its header, and a restart reads what it holds as a kept
// output that misses bytes (truncated, whatever its counts say); its
// rewrites after the restart keep saying so. Where the header cannot be
// written either, the spool is removed: none is read rather than one that
// looks whole.
func TestAbandonedSpoolReadsAsLost(t *testing.T) {
	const limit = 1 << 10
	path := filepath.Join(t.TempDir(), "e.stdout")
	k := newKeptOutput(limit)
	sp, err := newSpool(path, int64(k.half))
	if err != nil {
		t.Fatal(err)
	}
	k.write([]byte("before"))
	sp.write([]byte("before"), k)
	sp.abandon(errors.New("test: write failed"))
	k.write([]byte(" after"))
	sp.write([]byte(" after"), k) // abandoned: not written
	sp.close()
	got, ok, err := readSpool(path, limit)
	if err != nil || !ok || string(got.head) != "before" || !got.lost || !got.truncated() {
		t.Fatalf("readSpool = %q lost %v truncated %v (ok %v, %v); want %q, lost and truncated", got.head, got.lost, got.truncated(), ok, err, "before")
	}
	// Taken up again after the restart: compactions keep the mark.
	sp2, err := reopenSpool(path, got)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for written := 0; written < 2*spoolSlack; written += len(chunk) {
		got.write(chunk)
		sp2.write(chunk, got)
	}
	if sp2.err != nil || sp2.t == 0 {
		t.Fatalf("spool err %v, header %d: want compacted without error", sp2.err, sp2.t)
	}
	sp2.close()
	if again, _, err := readSpool(path, limit); err != nil || !again.lost || again.total != got.total {
		t.Errorf("after a compaction: lost %v total %d (%v); want lost, total %d", again.lost, again.total, err, got.total)
	}

	// A spool whose header cannot be written is removed.
	ro, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := &spool{path: path, fd: ro, half: limit / 2}
	bad.abandon(errors.New("test: write failed"))
	bad.close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spool whose abandonment could not be marked: stat = %v, want removed", err)
	}
}

// TestRespoolBacksOff: a stream whose spool cannot be made again (here the
// spool directory is a file) tries less and less often, up to 16 times
// respoolEvery apart, and one success resets it.
func TestRespoolBacksOff(t *testing.T) {
	old := respoolEvery
	respoolEvery = time.Hour
	t.Cleanup(func() { respoolEvery = old })
	dir := t.TempDir()
	if err := os.WriteFile(SpoolDir(dir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &Reactor{cfg: Config{StateDir: dir}, log: zerolog.Nop()}
	e := &execution{id: "e"}
	s := &stream{name: "stdout", fd: -1, kept: newKeptOutput(1024)}
	s.kept.write([]byte("kept"))
	for i := 0; i < 6; i++ {
		s.respoolAt = time.Now().Add(-time.Second) // due
		r.respool(e, s)
	}
	if s.spool != nil || !s.respoolAt.After(time.Now().Add(15*time.Hour)) || s.respoolAt.After(time.Now().Add(17*time.Hour)) {
		t.Fatalf("after 6 failures: spool %v, next try in %v; want none, 16h", s.spool, time.Until(s.respoolAt).Round(time.Hour))
	}
	if err := os.Remove(SpoolDir(dir)); err != nil {
		t.Fatal(err)
	}
	s.respoolAt = time.Now().Add(-time.Second)
	r.respool(e, s)
	defer s.spool.close()
	if !s.spool.working() || !s.respoolAt.IsZero() || s.respoolFails != 0 {
		t.Fatalf("once it can: spool working %v, respoolAt %v, fails %d; want working, reset", s.spool.working(), s.respoolAt, s.respoolFails)
	}
	if got, ok, err := readSpool(spoolPath(dir, "e", "stdout"), 1024); err != nil || !ok || string(got.head) != "kept" {
		t.Errorf("spool holds %q (ok %v, %v), want the kept output", got.head, ok, err)
	}
}
