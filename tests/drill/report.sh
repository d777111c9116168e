#!/bin/sh
# Assembles docs/drills.md from the reports the drill tests wrote into $1
# (make drill).
set -e
cat <<'HEAD'
# Failure drills

Written by `make drill` (tests/drill): a mixed load of clients (quick
commands, megabytes of output, stdin-fed commands, terminals, cancels at
random moments, timeouts, follows that drop and resume by offset, followers
that never read, clients that vanish with requests in flight) against a real
corrald, while one fault at a time is injected. After each fault every
execution the drill asked for is checked: exactly one record, cleaned, with
the outcome that matches what happened to it (`lost` only where the daemon's
`daemon.info.survival` says it does not survive the fault; a start still in
flight at a kill of corrald whose command was never let run ends
`start_failed`, error "corrald restarted before the command was started;
nothing ran", counted apart), kept output equal
to what the child wrote (head and tail within the limit), and nothing left:
no process carrying the drill's marker, no execution cgroup or scope, no
workspace, no daemon fd above its idle count, no goroutine or fd of the
drill itself. Latency is exec.start to cleaned of a quick command, reported,
never asserted. `make test` runs the short form of the same drills (8
clients, 2 s of load, 3 s of fault, 2 s after, per fault); `make drill` the
full one (DRILL_CLIENTS, default 64; 10 s, 20 s, 10 s).

Bugs the drills found, each fixed with a test beside the code:

- a client that vanished with `exec.start` in flight left an execution
  registered in state `started` forever (exec.wait hung, `running` never
  dropped, a SIGTERM'd corrald drained it forever):
  `reactor.TestStartByVanishedClientStillEnds`;
- out of file descriptors, `exec.start` recorded the execution and answered
  it `start_failed` ("too many open files") instead of refusing with -32003:
  `reactor.TestStartOutOfFDsRefusedWithOverCapacity`;
- out of file descriptors, a failed cgroup `Prepare` left its cgroup behind
  for good (its cleanup needed an fd too):
  `scope.TestCgroupPrepareOutOfFDsLeavesNoCgroup`;
- a `kill -9` between `exited` and `cleaned` (no output spool) left a record
  saying exited 0 with none of its output (total_bytes 0):
  `reactor.TestExitedRecordCarriesKeptOutput`;
- a reload (SIGHUP handover) under load could end the daemon: the new image
  found the state directory locked "by pid <its own pid>" (the old image's
  lock, still held by a child it was forking at the exec) and exited 1,
  taking every execution it was handed with it:
  `store.TestLockHeldUnderOwnPidIsWaitedFor`;
- at the fd limit, a tree kill (cgroup.kill, then the freeze-and-signal
  fallback) failed with EMFILE and was never resent: the execution ended
  cleaned with a background child alive and its cgroup left behind
  (c4d3135: a failed kill or removal is retried while the scope is
  populated): `reactor.TestCleanupRetriesFailedKill`,
  `reactor.TestCleanupRetriesFailedRemove`; and the thaw after a
  freeze-and-signal needed a new fd, so a tree could stay frozen (e4df43d):
  `cgroupv2.TestSignalThawsAtFDLimit`;
- with about 100 fds open (many executions after a reload or a kill -9), a
  start could fail `fork/exec /proc/self/fd/100: permission denied`: Go's
  fork parks its exec-error pipe one above the child's highest fd, which
  could be the daemon's pinned corral-shim number (118429f: the child gets
  the shim on its own fd 6): `shim.TestPinnedShimRunsWhenAChildFdIsJustBelowIt`;
- a reload under load could outlast `WatchdogSec`: the watchdog runs on
  through the handover, which sent no ping, and the new image's first ping
  came an interval after its start; systemd SIGABRTed the new image and
  the restarted one adopted nothing (63 lost in one sd-reload phase;
  3e0244a): `tests/survival.TestReloadFeedsWatchdog`; and a notification
  to a PID 1 that does not read could block the loop (46e7675):
  `systemd.TestNotifierDoesNotBlockWhenReceiverStalls`;
- once a restart takes over `started` records (issue 14: survival from
  the moment a command is let run), the order of a start's parked fds
  mattered: the pidfd went first, and a `kill -9` between its message and
  its pipes' had the restarted corrald adopt the execution without its
  stdout read end, its output lost and its command killed by SIGPIPE at
  its next write (before, such a record was not adopted: `lost`). Seen
  once, in a short sd-kill-9 run of that work: a slow-follow `seq` ended
  `signaled` where it exits 0. Reproduced by widening that window (a
  300 ms sleep after the pidfd's store, not committed): 2 of 2 short
  sd-kill-9 runs had 7 and 10 wrong (`seq` and follow commands `signaled`
  SIGPIPE with `adopted` 1, quick ones kept 0 of their 28 bytes). The
  pidfd is parked last, after every pipe; with the same sleep before it,
  2 of 2 runs had 0 wrong (8 and 5 `lost`, allowed, with the reason):
  `reactor.TestParkPidfdLast`;
- the restart's "never ran" rule (a `started` record with nothing in the
  fd store and an empty scope ends `start_failed`, "nothing ran") was
  applied where starts are not parked before they may run: the full drill
  at 148d16a had 5 wrong in host kill-9 (quick, stdin and tty commands
  that had run and exited ended `start_failed`); it holds only with the fd
  store on and a backend that holds its children until released (systemd)
  (c826832): `cmd/corrald.TestRestartNeverRanOnlyWhereStartsParkFirst`.

HEAD
for f in "$1"/*.md; do
	[ -e "$f" ] || continue
	cat "$f"
	echo
done
