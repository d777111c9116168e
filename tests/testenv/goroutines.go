package testenv

import (
	"fmt"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"
)

// GoroutineStacks returns the stack of every goroutine, by goroutine id.
// Telling goroutines apart by id, not counting them, keeps those that end
// meanwhile (an earlier test's) from hiding new ones.
func GoroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	m := make(map[string]string)
	for _, g := range strings.Split(string(buf), "\n\n") {
		// "goroutine 12 [chan receive]:\n..."
		if f := strings.Fields(g); len(f) >= 2 && f[0] == "goroutine" {
			m[f[1]] = g
		}
	}
	return m
}

// NewGoroutines returns the stacks of the goroutines now running that were
// not in before and that match (nil: every one).
func NewGoroutines(before map[string]string, match func(stack string) bool) []string {
	var out []string
	for id, st := range GoroutineStacks() {
		if _, ok := before[id]; !ok && (match == nil || match(st)) {
			out = append(out, st)
		}
	}
	return out
}

// WaitGoroutinesSettle waits up to bound for at most max goroutines not in
// before and matching match (nil: every one) to be left. It returns how
// many there were at the first look, the stacks of those left at the end
// and how long it waited.
func WaitGoroutinesSettle(before map[string]string, match func(stack string) bool, max int, bound time.Duration) (first int, left []string, took time.Duration) {
	start := time.Now()
	left = NewGoroutines(before, match)
	first = len(left)
	for len(left) > max && time.Since(start) < bound {
		time.Sleep(20 * time.Millisecond)
		left = NewGoroutines(before, match)
	}
	return first, left, time.Since(start)
}

// GroupStacks prints stacks that differ only in goroutine ids, arguments,
// pc offsets and wait times once, with their count, most frequent first.
func GroupStacks(stacks []string) string {
	var (
		args    = regexp.MustCompile(`\((?:0x|\{|\.\.\.|\)).*$`) // a call's arguments, to the line's end
		pc      = regexp.MustCompile(` \+0x[0-9a-f]+$`)
		creator = regexp.MustCompile(` in goroutine \d+$`)
		waited  = regexp.MustCompile(`, \d+ minutes`)
	)
	count := make(map[string]int)
	for _, st := range stacks {
		lines := strings.Split(strings.TrimSpace(st), "\n")
		// "goroutine 12 [chan receive, 2 minutes]:" -> "[chan receive]"
		key := []string{waited.ReplaceAllString(strings.TrimSuffix(strings.Join(strings.Fields(lines[0])[2:], " "), ":"), "")}
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "\t") {
				key = append(key, pc.ReplaceAllString(l, ""))
			} else {
				key = append(key, creator.ReplaceAllString(args.ReplaceAllString(l, "(...)"), ""))
			}
		}
		count[strings.Join(key, "\n")]++
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if count[keys[i]] != count[keys[j]] {
			return count[keys[i]] > count[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d goroutine(s) %s\n\n", count[k], k)
	}
	return b.String()
}
