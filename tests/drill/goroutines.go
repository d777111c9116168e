package drill

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Goroutines are a daemon's goroutines, each as its stack in a Go
// traceback ("goroutine 12 [select]:\n" and the frames).
type Goroutines []string

// DaemonGoroutines reads the daemon's goroutines from its metrics endpoint
// on the unix socket sock (corrald --metrics-listen unix:PATH):
// /debug/pprof/goroutine?debug=2, every goroutine's stack, taken with the
// world stopped, less those serving the endpoint's connections (this
// read's, and a read before's that may still be ending). It is exact,
// where go_goroutines is not: that one is sampled inside the scrape among
// a varying number of the Prometheus registry's own collecting goroutines
// (and runtime.NumGoroutine may read low while goroutines come and go):
// scrapes of an idle daemon read 17 to 21 (at 1b6b218), so one baseline
// read low failed every later count by one.
func DaemonGoroutines(ctx context.Context, sock string) (Goroutines, error) {
	b, err := metricsGet(ctx, sock, "/debug/pprof/goroutine?debug=2")
	if err != nil {
		return nil, fmt.Errorf("daemon goroutines: %w", err)
	}
	var g Goroutines
	for _, st := range ParseGoroutines(string(b)) {
		if !metricsConn(st) {
			g = append(g, st)
		}
	}
	if len(g) == 0 {
		return nil, fmt.Errorf("daemon goroutines: no goroutine in %.200q", b)
	}
	return g, nil
}

// metricsGet reads path from the metrics endpoint on the unix socket sock
// on a connection of its own and returns the body of a 200 answer once the
// daemon has closed its end of that connection (the request asks for
// Connection: close; the end of the answer is the daemon's close): its fd
// is then no longer among the daemon's, and a count of them right after
// (the leftover check) does not see the checker's own read. With an
// http.Client the daemon still held it, closing it asynchronously after
// the client had its answer.
func metricsGet(ctx context.Context, sock, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: corrald\r\nConnection: close\r\n\r\n", path); err != nil {
		return nil, err
	}
	all, err := io.ReadAll(nc) // to the daemon's close
	if err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(all)), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %.200s", resp.Status, b)
	}
	return b, nil
}

// ParseGoroutines splits a traceback of every goroutine into stacks.
func ParseGoroutines(dump string) Goroutines {
	var g Goroutines
	for _, block := range strings.Split(dump, "\n\n") {
		block = strings.TrimSpace(block)
		if strings.HasPrefix(block, "goroutine ") {
			g = append(g, block)
		}
	}
	return g
}

// origin is the function a goroutine's stack started in (the wrapper of
// one not yet run: "startBackgroundRead.gowrap2") and what created it
// ("" for the main goroutine), without arguments.
func origin(stack string) (start, created string) {
	for _, l := range strings.Split(stack, "\n")[1:] {
		if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "...") || strings.HasPrefix(l, "runtime.goexit(") || l == "" {
			continue
		}
		if c, ok := strings.CutPrefix(l, "created by "); ok {
			created, _, _ = strings.Cut(c, " in goroutine ")
			break
		}
		start = l
		if i := strings.LastIndex(start, "("); i > 0 && strings.HasSuffix(start, ")") {
			start = start[:i] // the arguments
		}
	}
	return start, created
}

// kind is what tells a goroutine apart from others of its kind, wherever
// it is blocked now: the function it started in and what created it
// ("reactor.(*reaper).run, created by reactor.startReaper").
func kind(stack string) string {
	start, created := origin(stack)
	k := strings.TrimPrefix(start, "github.com/corral-dev/corral/")
	if created != "" {
		k += ", created by " + strings.TrimPrefix(created, "github.com/corral-dev/corral/")
	}
	return k
}

// metricsConn says whether a goroutine serves a connection to the metrics
// endpoint (the daemon's one net/http server): the reads' own, the one
// asking and those of a read before still ending, which DaemonGoroutines
// leaves out.
func metricsConn(stack string) bool {
	_, created := origin(stack)
	return created == "net/http.(*Server).Serve" || created == "net/http.(*connReader).startBackgroundRead"
}

// More says which kinds of goroutines g has more of than base, and fewer,
// each with the stack of one of g's (bounded): for a failure that names
// the goroutine left behind. "" when the kinds and counts are the same.
func (g Goroutines) More(base Goroutines) string {
	count := map[string]int{}
	example := map[string]string{}
	for _, s := range g {
		k := kind(s)
		count[k]++
		example[k] = s
	}
	for _, s := range base {
		count[kind(s)]--
	}
	var kinds []string
	for k, n := range count {
		if n != 0 {
			kinds = append(kinds, k)
		}
	}
	sort.Slice(kinds, func(i, j int) bool {
		if count[kinds[i]] != count[kinds[j]] {
			return count[kinds[i]] > count[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	var out strings.Builder
	for _, k := range kinds {
		n := count[k]
		if n < 0 {
			fmt.Fprintf(&out, "%d fewer: %s\n", -n, k)
			continue
		}
		st := strings.Split(example[k], "\n")
		if len(st) > 13 {
			st = append(st[:13], "\t...")
		}
		fmt.Fprintf(&out, "%d more: %s, e.g.\n%s\n", n, k, strings.Join(st, "\n"))
		if out.Len() > 8000 {
			out.WriteString("(more left out)\n")
			break
		}
	}
	return strings.TrimSuffix(out.String(), "\n")
}
