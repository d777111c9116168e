package reactor

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sysfile"
)

// reaper makes the daemon a child subreaper and reaps the orphans that get
// reparented to it: descendants whose parent died before them. Without it
// they would go to PID 1, and a PID 1 that does not reap (a container's
// shell, some VM agents) leaves them as zombies forever, which also keeps a
// process group from ever becoming empty.
//
// It must never reap a main process: that exit belongs to the one Wait on
// the pidfd. Spawns hold mu for reading around fork-and-register; the reaper
// holds it for writing while it reaps, so every child it sees is either
// registered as a main process or an orphan.
type reaper struct {
	log   zerolog.Logger
	mu    sync.RWMutex
	mains map[int]int // pid -> registrations; guarded by mainsMu
	mmu   sync.Mutex
	stop  chan struct{}
	done  chan struct{}
	// sigReaps counts the reaps done for SIGCHLD (tests).
	sigReaps atomic.Int64
}

func startReaper(log zerolog.Logger, mains ...int) (*reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, os.NewSyscallError("prctl PR_SET_CHILD_SUBREAPER", err)
	}
	rp := &reaper{log: log, mains: make(map[int]int), stop: make(chan struct{}), done: make(chan struct{})}
	for _, pid := range mains { // adopted main processes (adopt_linux.go)
		rp.mains[pid]++
	}
	go rp.run()
	return rp, nil
}

// fork runs start (which forks) and registers the pid it returns as a main
// process, with no reaping in between.
func (rp *reaper) fork(start func() (int, error)) error {
	if rp == nil {
		_, err := start()
		return err
	}
	rp.mu.RLock()
	defer rp.mu.RUnlock()
	pid, err := start()
	if err == nil {
		rp.mmu.Lock()
		rp.mains[pid]++
		rp.mmu.Unlock()
	}
	return err
}

// holdForks waits until no fork is in flight and keeps new ones from
// starting until release is called. A fork in flight is a cmd.Start that
// has not returned: its child may not have exec'd yet and holds copies of
// every fd of ours (the store's lock among them) until it does; once
// cmd.Start returned, the child has exec'd and they are gone. For a
// handover's exec, so the next image finds none of its fds held by a
// child of the old one. A no-op on a nil reaper.
func (rp *reaper) holdForks() (release func()) {
	if rp == nil {
		return func() {}
	}
	rp.mu.Lock()
	return rp.mu.Unlock
}

// reaped unregisters a main process after its Wait.
func (rp *reaper) reaped(pid int) {
	if rp == nil {
		return
	}
	rp.mmu.Lock()
	if rp.mains[pid]--; rp.mains[pid] <= 0 {
		delete(rp.mains, pid)
	}
	rp.mmu.Unlock()
}

func (rp *reaper) run() {
	defer close(rp.done)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGCHLD)
	defer signal.Stop(sig)
	tick := time.NewTicker(time.Second) // a SIGCHLD can coalesce; sweep anyway
	defer tick.Stop()
	// Every main process's exit sends a SIGCHLD too, hundreds a second
	// under load, while an orphan is rare: the signal's reaps are at most
	// sigReapEvery apart, a signal in between reaping at the end of the
	// interval. Nothing waits for them: the cleanup reaps the orphans
	// itself before it removes a scope (reapOrphans).
	var last time.Time
	var later <-chan time.Time
	for {
		select {
		case <-rp.stop:
			return
		case <-sig:
			if wait := time.Until(last.Add(sigReapEvery)); wait > 0 {
				if later == nil {
					later = time.After(wait)
				}
				continue
			}
			rp.reap(leaderChildren)
			rp.sigReaps.Add(1)
			last = time.Now()
		case <-later:
			later = nil
			rp.reap(leaderChildren)
			rp.sigReaps.Add(1)
			last = time.Now()
		case <-tick.C:
			rp.reap(children)
		}
	}
}

// sigReapEvery is the shortest interval between two reaps on SIGCHLD.
const sigReapEvery = 20 * time.Millisecond

// reapOrphans reaps the orphans that have exited: the children of the
// daemon's main thread that are not registered main processes. The kernel
// hands an orphan to the first live thread of its subreaper, which is the
// main thread (it lives as long as the daemon), so this reads one file
// however many threads the daemon has (thousands with --no-pidfd). The
// once-a-second sweep reads every thread's list. Any goroutine; a no-op on
// a nil reaper.
func (rp *reaper) reapOrphans() {
	if rp == nil {
		return
	}
	rp.reap(leaderChildren)
}

// reap reaps every exited child that list returns and that is not a
// registered main process.
func (rp *reaper) reap(list func() []int) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	for _, pid := range list() {
		rp.mmu.Lock()
		main := rp.mains[pid] > 0
		rp.mmu.Unlock()
		if main {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			rp.log.Debug().Int("pid", pid).Msg("reaped orphan")
		}
	}
}

func (rp *reaper) close() {
	if rp == nil {
		return
	}
	close(rp.stop)
	<-rp.done
}

// leaderChildren lists the children of the daemon's main thread, where
// orphans are reparented.
func leaderChildren() []int {
	b, err := sysfile.Read("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/children")
	if err != nil {
		return nil
	}
	return parsePids(b, nil)
}

// parsePids appends the pids of a children file to pids.
func parsePids(b []byte, pids []int) []int {
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// children lists the daemon's direct children from every thread's
// /proc/self/task/<tid>/children.
func children() []int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	var pids []int
	for _, t := range tasks {
		b, err := sysfile.Read("/proc/self/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		pids = parsePids(b, pids)
	}
	return pids
}
