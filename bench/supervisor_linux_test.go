package bench

import (
	"strings"
	"testing"
	"time"
)

// A (c) baseline whose children end before all are counted fails with the
// supervisor's account of them (which child, its exit status, its age), not
// with the count at the deadline alone: with sleep 60 and a 65 s start on a
// loaded host the row said only "0 baseline sleeps alive after starting
// 4950". sleep 0 makes every child end at once, as the early ones did then.
func TestBaselineRowSaysWhyChildrenAreMissing(t *testing.T) {
	mark := markValue() + "-test-short"
	t.Cleanup(func() { killMarked(mark) })
	// The children are gone long before the bound: a short one keeps the
	// test short.
	_, err := baselineRow(20, "0", mark, 2*time.Second)
	if err == nil {
		t.Fatal("baseline row of children that exit at once passed")
	}
	t.Logf("the row's error: %v", err)
	// The supervisor says it when all are started (or, if none had exited
	// yet, when the count falls short and it is stopped).
	for _, want := range []string{
		"children exited before they were told to stop",
		"ended by itself: exit status 0",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if n := countMarked(mark); n != 0 {
		t.Errorf("%d children left after the failed row", n)
	}
}

// Children that live long enough are all counted alive at once, measured,
// stopped and gone; the supervisor keeps a goroutine per pipe and per Wait.
func TestBaselineRowCountsLiveChildren(t *testing.T) {
	const n = 20
	mark := markValue() + "-test-live"
	t.Cleanup(func() { killMarked(mark) })
	res, err := baselineRow(n, scaleSleepArg, mark, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.goroutines < 3*n {
		t.Errorf("supervisor had %d goroutines with %d children running, want at least %d (two pipes and a Wait each)", res.goroutines, n, 3*n)
	}
	if res.running.FDs-res.idle.FDs < 3*n {
		t.Errorf("supervisor's fds %d -> %d with %d children running, want at least %d more (two pipes and a pidfd each)",
			res.idle.FDs, res.running.FDs, n, 3*n)
	}
	if n := countMarked(mark); n != 0 {
		t.Errorf("%d children left after the row", n)
	}
}
