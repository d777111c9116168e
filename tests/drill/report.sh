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
never asserted. `make test` runs the short form of the same drills.

HEAD
for f in "$1"/*.md; do
	[ -e "$f" ] || continue
	cat "$f"
	echo
done
