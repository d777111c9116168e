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
`daemon.info.survival` says it does not survive the fault), kept output equal
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
  `store.TestLockHeldUnderOwnPidIsWaitedFor`.

HEAD
for f in "$1"/*.md; do
	[ -e "$f" ] || continue
	cat "$f"
	echo
done
