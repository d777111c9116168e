package scope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// cgroupScope is one execution's cgroup. Its methods may be called from any
// goroutine; mu guards fd and the last Stats, the rest is kernel state.
type cgroupScope struct {
	cg         cgroupv2.Dir
	at         cgroupv2.At // cg read relative to the backend's base: Empty and Stats
	name       string      // cgroup path relative to the cgroup2 root
	unenforced Limits
	// memory and pids: whether the backend's base gives its children those
	// controllers (their files exist); Stats reads only those that do.
	memory, pids bool

	mu       sync.Mutex
	fd       int   // directory fd for CLONE_INTO_CGROUP, -1 once closed
	last     Stats // last successful Stats, returned once the cgroup is gone
	haveLast bool
}

var (
	_ Scope         = (*cgroupScope)(nil)
	_ LimitReporter = (*cgroupScope)(nil)
	_ EmptyNotifier = (*cgroupScope)(nil)
	_ ExitStatser   = (*cgroupScope)(nil)
)

// WatchEmpty opens the scope's cgroup.events for epoll (see
// cgroupv2.EmptyEvents).
func (s *cgroupScope) WatchEmpty() (EmptyWatch, error) { return s.cg.OpenEmptyEvents() }

func (s *cgroupScope) Name() string { return s.name }

// Unenforced reports the asked MemoryBytes and TasksMax whose controller is
// not available. CPUMS is never reported: Stats always measures CPU.
func (s *cgroupScope) Unenforced() Limits { return s.unenforced }

func (s *cgroupScope) closeFD() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("close cgroup fd of %s: %w", s.cg, os.NewSyscallError("close", err))
	}
	return nil
}

// Started closes the directory fd: the kernel placed the child at clone.
func (s *cgroupScope) Started(_ context.Context, _ int) error { return s.closeFD() }

// Signal sends sig to every process in the scope, including child cgroups a
// process made: SIGKILL through cgroup.kill (Kill), any other signal with
// the cgroup frozen so that no process forks a child the signal would miss
// (cgroupv2.Dir.Signal). Blocking: up to ~100ms waiting for the freeze.
func (s *cgroupScope) Signal(sig unix.Signal) error {
	if sig == unix.SIGKILL {
		return s.Kill()
	}
	return s.cg.Signal(sig)
}

// Kill SIGKILLs every process in the scope and its child cgroups, including
// ones forking at that moment (cgroup.kill; freeze-and-signal on a kernel
// before 5.14). A removed scope has nothing to kill.
func (s *cgroupScope) Kill() error { return s.cg.Kill() }

// Empty reads "populated" from cgroup.events, which counts child cgroups
// too. Exited but unreaped processes (zombies) no longer count. A removed
// scope is empty.
func (s *cgroupScope) Empty() (bool, error) { return s.at.Empty() }

// Stats reads cpu.stat (always present), memory.peak and memory.events (with
// the memory controller), pids.peak and pids.current (with the pids
// controller); without pids it counts cgroup.threads, in the scope and any
// child cgroups. What it cannot read is Unknown. Once the scope is removed it
// returns the last reading it made, so read Stats before Remove for the final
// usage.
func (s *cgroupScope) Stats() (Stats, error) { return s.stats(false) }

// ExitStats reads cgroup.events first: a scope no process is left in has
// no task to count, so its Tasks is 0 without reading pids.current, or
// cgroup.stat and cgroup.threads where the pids controller is off (two of
// the three reads of Stats on such a host). The rest is as Stats.
func (s *cgroupScope) ExitStats() (Stats, bool, error) {
	empty, err := s.at.Empty()
	if err != nil {
		st, serr := s.stats(false)
		return st, false, errors.Join(err, serr)
	}
	st, err := s.stats(empty)
	return st, empty, err
}

// stats is Stats; with empty (the scope was just read unpopulated) the
// task count is 0 without reading it.
func (s *cgroupScope) stats(empty bool) (Stats, error) {
	cs, err := s.at.StatsOf(s.memory, s.pids && !empty)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// Removed: the last reading is the final one.
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.haveLast {
				return s.last, nil
			}
		}
		return Stats(cs), err
	}
	st := Stats(cs)
	if empty {
		st.Tasks = 0
		if s.pids {
			st.TasksPeak = s.at.Count("pids.peak")
		}
	}
	if st.Tasks == Unknown {
		if n, err := s.cg.Threads(); err == nil {
			st.Tasks = n
		}
	}
	if st.TasksPeak == Unknown {
		st.TasksPeak = st.Tasks
	}
	s.mu.Lock()
	s.last, s.haveLast = st, true
	s.mu.Unlock()
	return st, nil
}

// Remove closes the directory fd if Started did not, and deletes the scope
// and any child cgroups its processes made. It fails (EBUSY) while a process
// is left; a scope already gone is not an error. Idempotent.
func (s *cgroupScope) Remove() error {
	ferr := s.closeFD()
	if err := s.cg.RemoveTree(); err != nil {
		return errors.Join(fmt.Errorf("remove cgroup scope: %w", err), ferr)
	}
	return ferr
}

var _ Limiter = (*cgroupScope)(nil)

// SetLimits rewrites memory.max (with memory.swap.max 0) and pids.max where
// those controllers exist; zero fields lift the limit. What cannot be set
// is reported by Unenforced.
func (s *cgroupScope) SetLimits(_ context.Context, l Limits) error {
	write := func(file string, v int64, zeroMeans string) error {
		val := zeroMeans
		if v > 0 {
			val = strconv.FormatInt(v, 10)
		}
		if err := s.cg.Write(file, val); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("set %s of %s: %w", file, s.name, err)
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unenforced = Limits{}
	if _, err := os.Stat(filepath.Join(s.cg.Path(), "memory.max")); err == nil {
		if err := write("memory.max", l.MemoryBytes, "max"); err != nil {
			return err
		}
		swap := int64(0)
		if l.MemoryBytes == 0 {
			swap = -1
		}
		if swap == 0 {
			if err := s.cg.Write("memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("set memory.swap.max of %s: %w", s.name, err)
			}
			// As in Prepare: an OOM kill takes the whole tree.
			if err := s.cg.Write("memory.oom.group", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("set memory.oom.group of %s: %w", s.name, err)
			}
		} else if err := write("memory.swap.max", 0, "max"); err != nil {
			return err
		}
	} else {
		s.unenforced.MemoryBytes = l.MemoryBytes
	}
	if _, err := os.Stat(filepath.Join(s.cg.Path(), "pids.max")); err == nil {
		if err := write("pids.max", l.TasksMax, "max"); err != nil {
			return err
		}
	} else {
		s.unenforced.TasksMax = l.TasksMax
	}
	return nil
}
