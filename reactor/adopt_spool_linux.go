package reactor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A spool is the kept output of one stream of a running execution, on disk,
// so that a crash of corrald loses no byte it had read from the pipe: every
// chunk is written to the spool (one pwrite, in the kernel's hands once it
// returns) before the next read. The restarted corrald rebuilds the kept
// output from it; the pipe, parked in the fd store, holds the rest.
//
// Layout: an 8-byte header T (little endian), then data. T == 0: the data
// is the stream from offset 0, contiguous. T > 0: the data is the head
// (exactly half bytes, the stream's first) followed by the stream from
// offset T on. Appending is one pwrite at the end; when the data outgrows
// what is kept by spoolSlack, the spool is rewritten from the kept output
// (a new file renamed over the old one), so it stays bounded.
//
// T's top bit (spoolLost) says the data misses bytes of the stream: set
// when a write to the spool fails (abandon: from then on only memory keeps
// what is read, and a crash loses it), and kept by every rewrite of a kept
// output that misses bytes (keptOutput.lost). The restarted corrald then
// prefers the store's copy of the output, which the exited record carries
// when a spool is not working (recordOutputs), and says truncated where
// there is none.
type spool struct {
	path string
	fd   int
	half int64 // bytes kept at each end (keptOutput.half)
	t    int64 // header
	size int64 // data bytes
	err  error // first failed write: the spool is abandoned
	// spliced counts bytes readOutput moved from the pipe into the file
	// that write has not accounted for yet.
	spliced int64
}

const (
	spoolHeader = 8
	spoolSlack  = 1 << 20
	spoolLost   = uint64(1) << 63 // in the header: the data misses bytes
)

// SpoolDir holds the spools: <StateDir>/spool, one file "<id>.<stream>"
// per stream of a running execution.
func SpoolDir(stateDir string) string { return filepath.Join(stateDir, "spool") }

func spoolPath(stateDir, id, stream string) string {
	return filepath.Join(SpoolDir(stateDir), id+"."+stream)
}

// newSpool creates an empty spool at path for a stream keeping 2*half.
func newSpool(path string, half int64) (*spool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool %s: %w", path, os.NewSyscallError("open", err))
	}
	sp := &spool{path: path, fd: fd, half: half}
	if _, err := unix.Pwrite(fd, make([]byte, spoolHeader), 0); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("spool %s: %w", path, os.NewSyscallError("pwrite", err))
	}
	return sp, nil
}

// working reports whether sp keeps what is read: it exists and no write
// to it failed (a failure abandons it). A nil spool is not working.
func (sp *spool) working() bool { return sp != nil && sp.err == nil }

// write appends chunk, which k (the stream's kept output) has just taken
// in. Loop goroutine only.
func (sp *spool) write(chunk []byte, k *keptOutput) {
	if !sp.working() || len(chunk) == 0 {
		return
	}
	if sp.spliced >= int64(len(chunk)) {
		// Already in the file (readOutput).
		sp.spliced -= int64(len(chunk))
		sp.size += int64(len(chunk))
		sp.maybeCompact(k)
		return
	}
	n, err := unix.Pwrite(sp.fd, chunk, spoolHeader+sp.size)
	if err == nil && n < len(chunk) {
		err = errors.New("short write")
	}
	if err != nil {
		sp.abandon(fmt.Errorf("spool %s: %w", sp.path, err))
		return
	}
	sp.size += int64(n)
	sp.maybeCompact(k)
}

// abandon gives sp up after its first failure, err: nothing more is
// written to it, and its header says its data misses bytes (spoolLost), so
// that a restart after a crash does not take what it holds for the whole
// stream. Where even that write fails the file is emptied (a spool without
// a header reads as bytes lost, as one whose newSpool failed), and failing
// that removed: a restart then knows only the record's counts and does not
// say truncated (as where the spool's file could not be created), but it
// serves no stale data as the whole stream. Loop goroutine only.
func (sp *spool) abandon(err error) {
	sp.err = err
	var hdr [spoolHeader]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(sp.t)|spoolLost)
	if n, werr := unix.Pwrite(sp.fd, hdr[:], 0); werr == nil && n == len(hdr) {
		return
	}
	if unix.Ftruncate(sp.fd, 0) == nil {
		return
	}
	if rerr := os.Remove(sp.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		sp.err = fmt.Errorf("%w; not marked abandoned: %v", err, rerr)
	}
}

func (sp *spool) maybeCompact(k *keptOutput) {
	kept := int64(len(k.head) + len(k.tail))
	if sp.size > kept+max(sp.half, spoolSlack) {
		sp.compact(k)
	}
}

// readOutput reads what s's pipe holds into r.readBuf. With a spool (and
// no redaction, whose output differs from what the pipe held), the bytes
// go from the pipe into the spool file in one splice(2), so a crash of
// corrald at any instant loses none that left the pipe, and are read back
// from the file (the page cache). Loop goroutine only.
func (r *Reactor) readOutput(s *stream) (int, error) {
	sp := s.spool
	if !sp.working() || sp.spliced != 0 || s.red != nil || s.tty {
		return unix.Read(s.fd, r.readBuf)
	}
	off := spoolHeader + sp.size
	n, err := unix.Splice(s.fd, nil, sp.fd, &off, len(r.readBuf), unix.SPLICE_F_NONBLOCK)
	switch {
	case err == unix.EINVAL:
		// No splice for this pair: plain reads from now on.
		sp.spliced = -1
		return unix.Read(s.fd, r.readBuf)
	case err == unix.EAGAIN || err == unix.EINTR || err == nil && n <= 0:
		return int(n), err // the pipe is empty, or at EOF
	case err != nil:
		// The spool's side failed (its file system full, an I/O error):
		// the pipe has no other error to give. The spool is abandoned and
		// the pipe read plainly, as for a failed write; ending the stream
		// here would close the pipe under a child still writing.
		sp.abandon(fmt.Errorf("spool %s: splice: %w", sp.path, err))
		s.respoolAt = time.Now().Add(respoolEvery)
		r.log.Warn().Err(sp.err).Str("stream", s.name).Msg("spool: abandoned; a crash of corrald would lose what is read from now on")
		return unix.Read(s.fd, r.readBuf)
	}
	m, err := unix.Pread(sp.fd, r.readBuf[:n], spoolHeader+sp.size)
	if err != nil || int64(m) != n {
		// The bytes left the pipe but cannot be read back: those not read
		// are not kept (said here, once: the spool is abandoned and the
		// pipe is read plainly from now on). Nothing read back is not the
		// pipe's EOF: EINTR makes drain read again.
		m = max(m, 0)
		sp.abandon(fmt.Errorf("spool %s: read back %d of %d bytes: %v", sp.path, m, n, err))
		s.respoolAt = time.Now().Add(respoolEvery)
		if int64(m) < n {
			s.kept.lost = true // the record says truncated
		}
		r.log.Error().Err(sp.err).Int64("lost_bytes", n-int64(m)).Str("stream", s.name).
			Msg("spool: output could not be read back; those bytes are not kept")
		if m == 0 {
			return 0, unix.EINTR
		}
		return m, nil
	}
	sp.spliced = n
	return m, nil
}

// compact rewrites the spool as k's kept output.
func (sp *spool) compact(k *keptOutput) {
	fd, err := replaceSpool(sp.path, k)
	if err != nil {
		sp.abandon(err)
		return
	}
	unix.Close(sp.fd)
	sp.fd = fd
	sp.t, sp.size = spoolT(k), int64(len(k.head)+len(k.tail))
}

// replaceSpool writes k's kept output as the spool at path: aside, then
// renamed over it, so a crash at any moment leaves the old file or the new
// one whole. It returns the new file's fd.
func replaceSpool(path string, k *keptOutput) (int, error) {
	tmp := path + ".tmp"
	if err := writeSpoolFile(tmp, k); err != nil {
		_ = os.Remove(tmp)
		return -1, err
	}
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(tmp)
		return -1, fmt.Errorf("spool %s: %w", tmp, os.NewSyscallError("open", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		unix.Close(fd)
		_ = os.Remove(tmp)
		return -1, fmt.Errorf("spool: %w", err) // "rename TMP PATH: ...", from os
	}
	return fd, nil
}

// respoolEvery is how long a stream whose spool could not be opened, or
// was abandoned, waits before its next output tries to make one again.
var respoolEvery = time.Second

// respool makes s a working spool again, from its kept output, once
// s.respoolAt passed: a spool that could not be opened or was abandoned
// (EMFILE, the file system full) need not leave the stream unspooled for
// its life. On failure it tries again later: respoolEvery, doubled at each
// failure in a row up to 16 times that, so a disk that stays full costs
// the loop little. Loop goroutine.
func (r *Reactor) respool(e *execution, s *stream) {
	now := time.Now()
	if now.Before(s.respoolAt) {
		return
	}
	if err := r.spoolKept(e, s); err != nil {
		s.respoolFails = min(s.respoolFails+1, 4)
		s.respoolAt = now.Add(respoolEvery << s.respoolFails)
		return
	}
	r.log.Info().Str("exec_id", e.id).Str("stream", s.name).Int64("bytes", s.kept.kept()).Msg("spool: working again")
}

// spoolKept gives s a new spool holding its kept output, in place of the
// file there may be (replaceSpool). Loop goroutine only.
func (r *Reactor) spoolKept(e *execution, s *stream) error {
	path := spoolPath(r.cfg.StateDir, e.id, s.name)
	fd, err := replaceSpool(path, s.kept)
	if err != nil {
		return err
	}
	s.spool.close()
	s.spool = &spool{path: path, fd: fd, half: int64(s.kept.half), t: spoolT(s.kept), size: s.kept.kept()}
	s.respoolAt, s.respoolFails = time.Time{}, 0
	return nil
}

// spoolT is the header that describes k's kept output.
func spoolT(k *keptOutput) int64 {
	if k.total == int64(len(k.head)+len(k.tail)) {
		return 0 // nothing dropped: contiguous
	}
	return k.tailOffset()
}

// writeSpoolFile writes k's kept output as a spool at path (replaceSpool's
// file aside).
func writeSpoolFile(path string, k *keptOutput) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	buf := make([]byte, spoolHeader, spoolHeader+len(k.head)+len(k.tail))
	hdr := uint64(spoolT(k))
	if k.lost {
		hdr |= spoolLost
	}
	binary.LittleEndian.PutUint64(buf, hdr)
	buf = append(buf, k.head...)
	buf = append(buf, k.tailBytes()...)
	if err := os.WriteFile(path, buf, 0o600); err != nil {
		return fmt.Errorf("spool: %w", err) // os names the path
	}
	return nil
}

// close closes the spool's fd; the file stays until remove.
func (sp *spool) close() {
	if sp != nil && sp.fd >= 0 {
		unix.Close(sp.fd)
		sp.fd = -1
	}
}

// readSpool rebuilds the kept output of a stream keeping limit bytes from
// the spool at path. ok is false when there is none to go on with. The kept
// output of a spool that misses bytes (spoolLost) is lost, and so is that
// of one without a header: newSpool could not write it (the file system
// full), or abandon emptied the file, so what was read is not there.
func readSpool(path string, limit int64) (k *keptOutput, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return newKeptOutput(limit), false, nil
	}
	if err != nil {
		return newKeptOutput(limit), false, fmt.Errorf("read spool: %w", err)
	}
	k = newKeptOutput(limit)
	if len(b) < spoolHeader {
		k.lost = true
		if len(b) == 0 {
			return k, false, nil
		}
		return k, false, fmt.Errorf("read spool %s: %d bytes, no header", path, len(b))
	}
	hdr := binary.LittleEndian.Uint64(b)
	k.lost = hdr&spoolLost != 0
	t := int64(hdr &^ spoolLost)
	data := b[spoolHeader:]
	if t == 0 {
		k.write(data)
		return k, true, nil
	}
	half := int64(k.half)
	if int64(len(data)) < half || t < half {
		return k, false, fmt.Errorf("read spool %s: header %d does not fit %d data bytes", path, t, len(data))
	}
	k.write(data[:half])
	k.total = t
	k.write(data[half:])
	return k, true, nil
}

// reopenSpool continues appending to the spool at path, which holds k.
func reopenSpool(path string, k *keptOutput) (*spool, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spool %s: %w", path, os.NewSyscallError("open", err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("spool %s: %w", path, os.NewSyscallError("fstat", err))
	}
	return &spool{path: path, fd: fd, half: int64(k.half), t: spoolT(k), size: st.Size - spoolHeader}, nil
}

// maxPipeCapacity bounds pipeCapacity: a full pipe is kernel memory, and
// only a child that writes while corrald is down fills it.
const maxPipeCapacity = 16 << 20

var pipeCap struct {
	once sync.Once
	n    int
}

// pipeCapacity is what output pipes ask for: as much as
// /proc/sys/fs/pipe-max-size allows (at most maxPipeCapacity, at least
// pipeSize), so that a child writing while corrald restarts blocks as late
// as possible.
func pipeCapacity() int {
	pipeCap.once.Do(func() {
		pipeCap.n = pipeSize
		if b, err := os.ReadFile("/proc/sys/fs/pipe-max-size"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				pipeCap.n = min(max(n, pipeSize), maxPipeCapacity)
			}
		}
	})
	return pipeCap.n
}
