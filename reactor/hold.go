package reactor

// Holding the exited record of an execution nobody follows, so that the
// cleaned record carries it in one commit (issue 11, (a)).
//
// A state is told (exec.wait, exec.follow, exec.start's answer, exec.cancel's)
// only once its record is durable. When nobody is to be told of exited, its
// record is only the outcome's safekeeping until cleaned: on the host path
// the cleanup (the scope and the workspace removed off the loop) takes a few
// hundred microseconds, about one commit of the store's writer. Writing
// exited and then cleaned puts two commits, and the exited record's encoding
// and queueing on the loop, between the exit and the exec.wait answer; the
// cleaned commit also waited for the exited one on the one writer. So while
// the cleanup runs, the exited record is held on the loop and the cleaned
// record (which has the outcome) is written in its stead, from exited.
//
// The hold ends, and the exited record is written at once, as soon as
// anything would tell it or wait for it: a follower (Follow), an exec.cancel
// answer or any other wait for a durable state (whenCommitted), a handover
// (quiet), a failed removal (scopeRemoved's retry), or holdExitMax after the
// exit, so that a slow cleanup (systemd's stop of a scope) leaves the
// outcome undurable no longer than that. A crash of corrald while an exit is
// held is a crash before the exited commit (as one during that commit is):
// nobody was told of the exit, and the restarted daemon settles the
// execution from what the store and the fd store hold.

import (
	"time"

	"github.com/corral-dev/corral/api"
)

// holdExitMax bounds how long an exited record is held for the cleaned one;
// 0 holds none. A variable for the tests that hold it longer, or not at all
// (writeExitsAtOnce).
var holdExitMax = 5 * time.Millisecond

// mayHoldExit reports whether e's exited record, just made, may wait for
// the cleaned one: nobody follows e, exec.start's answer is not waiting for
// this record (it waits for the running record's write, in flight, or was
// sent), no exec.cancel answer waits for a durable state, and none of e's
// fds is parked in systemd's fd store: those leave the store once the
// outcome is durable, which must come before `cleaned` is told (a held exit
// made it the cleaned commit's follow-up, after exec.wait's answer), and a
// crash meanwhile without PIDFD_INFO_EXIT would end the execution lost.
// Under systemd the scope's stop outlasts holdExitMax anyway. Loop only.
func (r *Reactor) mayHoldExit(e *execution) bool {
	return holdExitMax > 0 && len(e.followers) == 0 && len(e.cancelAcks) == 0 &&
		(e.startAck == nil || e.persisting > 0) && e.prev != api.StateStarted &&
		len(e.parked) == 0
}

// holdExit starts e's cleanup with its exited record held: the record is
// written with cleaned (toCleaned, releaseExit), or at once (flushExit) when
// the cleanup could not begin its removal now or something needs the exited
// record durable. The observer is told of exited now, as commit would.
// Loop goroutine only.
func (r *Reactor) holdExit(e *execution, empty bool) {
	rec := r.snapshot(e)
	r.observe(e, e.prev, &rec)
	e.exitHeld = true
	r.startCleanup(e, empty)
	if !e.cleaning {
		// Cleanup waits for the tree or a pipe: no removal under way.
		r.flushExit(e)
		return
	}
	if e.exitHeld {
		e.holdWait = r.loop.AfterFunc(holdExitMax, func() {
			e.holdWait = nil
			r.flushExit(e)
		})
	}
}

// flushExit ends e's hold, if any, and writes its exited record now.
// Loop goroutine only.
func (r *Reactor) flushExit(e *execution) {
	if !e.exitHeld {
		return
	}
	r.releaseExit(e)
	if e.state != api.StateExited {
		return
	}
	r.writeExit(e, false)
}

// releaseExit ends e's hold without writing the exited record (the
// cleaned record, being queued, carries it). Loop goroutine only.
func (r *Reactor) releaseExit(e *execution) {
	e.exitHeld = false
	r.stopTimer(&e.holdWait)
}
