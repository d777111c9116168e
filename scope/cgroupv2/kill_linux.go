package cgroupv2

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Kill SIGKILLs every process in d and its child cgroups by writing "1" to
// cgroup.kill (Linux 5.14), which also reaches processes forking at that
// moment. Where that write fails (an older kernel has no cgroup.kill) it
// falls back to Signal(SIGKILL). A removed d has nothing to kill. Blocking
// only in the fallback.
func (d Dir) Kill() error {
	err := d.Write("cgroup.kill", "1")
	if err == nil || !d.Exists() {
		return nil
	}
	serr := d.Signal(unix.SIGKILL)
	switch {
	case serr == nil:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return serr // no cgroup.kill: the fallback's failure is the one
	}
	return fmt.Errorf("kill cgroup %s: %w", d, errors.Join(err, serr))
}

// signalRounds bounds how often Signal repeats a SIGKILL that it could not
// send with d frozen.
const signalRounds = 5

// Signal sends sig to every process in d and its child cgroups. The cgroup
// is frozen first (cgroup.freeze) so that no process forks a child the
// signal would miss, and thawed after, also on errors: a frozen cgroup
// never exits, and a frozen process gets the signal when thawed. Where d
// cannot be frozen (a v1 directory, a kernel before 5.2) a SIGKILL is sent
// in up to five rounds, until a round finds no process, to catch fresh
// forks: best effort against a fork bomb, where Kill's cgroup.kill is the
// real answer. A removed d is not an error. Blocking: up to ~100ms waiting
// for the freeze.
//
// cgroup.freeze stays open from the freeze to the thaw, so thawing needs no
// new file descriptor: at the fd limit (tests/drill, emfile) a thaw that
// opened the file anew failed with EMFILE and left the tree frozen, a
// running execution's included (exec.signal).
func (d Dir) Signal(sig unix.Signal) (err error) {
	if !d.Exists() {
		return nil
	}
	rounds := 1
	if f, ferr := d.freeze(); ferr == nil {
		defer func() {
			_, terr := f.WriteAt([]byte("0"), 0)
			if cerr := f.Close(); terr == nil {
				terr = cerr
			}
			if terr != nil && !Gone(terr) {
				err = errors.Join(err, fmt.Errorf("thaw cgroup %s: %w", d, terr))
			}
		}()
		d.waitFrozen(100 * time.Millisecond)
	} else if sig == unix.SIGKILL {
		rounds = signalRounds
	}
	for range rounds {
		found, err := d.signalOnce(sig)
		if err != nil {
			return fmt.Errorf("signal %s to cgroup %s: %w", unix.SignalName(sig), d, err)
		}
		if found == 0 {
			break
		}
	}
	return nil
}

// freeze writes "1" to d's cgroup.freeze and returns the file, open, for
// the thaw.
func (d Dir) freeze() (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(string(d), "cgroup.freeze"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteAt([]byte("1"), 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// signalOnce sends sig to every pid listed under d, once, and returns how
// many it found.
func (d Dir) signalOnce(sig unix.Signal) (int, error) {
	found := 0
	var errs []error
	err := d.Walk(func(c Dir) error {
		pids, err := c.Procs()
		if Gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, pid := range pids {
			found++
			if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("pid %d: %w", pid, os.NewSyscallError("kill", err)))
			}
		}
		return nil
	})
	return found, errors.Join(append(errs, err)...)
}

// waitFrozen waits until cgroup.events says "frozen 1", at most timeout. A
// task in uninterruptible sleep can delay freezing; then the signal is sent
// anyway.
func (d Dir) waitFrozen(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		data, err := d.Read("cgroup.events")
		if err != nil {
			return
		}
		if v, ok := Keyed(data, "frozen"); ok && v == 1 {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Empty reports whether no process is left in d or its child cgroups, from
// "populated" in cgroup.events. Exited but unreaped processes (zombies) no
// longer count. A removed d is empty. Cheap: one read.
func (d Dir) Empty() (bool, error) { return At{Dir: d}.Empty() }

// emptyOf is Empty of d from its cgroup.events read as data, err.
func emptyOf(d Dir, data []byte, err error) (bool, error) {
	if Gone(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read cgroup.events of %s: %w", d, err)
	}
	v, ok := Keyed(data, "populated")
	if !ok {
		return false, fmt.Errorf("read cgroup.events of %s: no populated key", d)
	}
	return v == 0, nil
}

// WaitEmpty polls Empty until it reports true or ctx ends.
func (d Dir) WaitEmpty(ctx context.Context) error {
	return PollEmpty(ctx, d.Empty)
}

// PollEmpty polls empty every 5ms until it reports true or ctx ends.
func PollEmpty(ctx context.Context, empty func() (bool, error)) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := empty()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for empty cgroup: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Destroy kills every process in d, waits until d is empty or ctx ends, and
// removes d with its child cgroups. A missing d is not an error. Blocking.
func (d Dir) Destroy(ctx context.Context) error {
	if err := d.Kill(); err != nil {
		return err
	}
	if err := d.WaitEmpty(ctx); err != nil {
		return fmt.Errorf("cgroup %s: %w", d, err)
	}
	return d.RemoveTree()
}
