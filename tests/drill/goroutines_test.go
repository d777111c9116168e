package drill

import (
	"strings"
	"testing"
)

// TestGoroutinesMore: two tracebacks of every goroutine compare by the
// function each goroutine started in and what created it, wherever each
// is blocked; the failure names the kinds there are more of, with one
// stack, and those there are fewer of.
func TestGoroutinesMore(t *testing.T) {
	base := ParseGoroutines(`goroutine 1 [select]:
main.(*corrald).serve(0xc000, {0x1, 0x2})
	/src/cmd/corrald/daemon.go:347 +0x7cb
main.main()
	/src/cmd/corrald/main.go:70 +0x1

goroutine 7 [IO wait]:
internal/poll.runtime_pollWait(0x7f, 0x72)
	/usr/local/go/src/runtime/netpoll.go:351 +0x85
github.com/corral-dev/corral/ipc.(*conn).serve(0xc001)
	/src/ipc/conn.go:140 +0x1
created by github.com/corral-dev/corral/ipc.(*Server).Serve in goroutine 5
	/src/ipc/server.go:190 +0x1

goroutine 9 [chan receive]:
os/signal.loop()
	/usr/local/go/src/os/signal/signal_unix.go:23 +0x1
created by os/signal.Notify.func1.1 in goroutine 1
	/usr/local/go/src/os/signal/signal.go:152 +0x1
`)
	if len(base) != 3 {
		t.Fatalf("ParseGoroutines found %d goroutines, want 3: %q", len(base), base)
	}
	// The same goroutines blocked elsewhere: nothing to say.
	same := ParseGoroutines(strings.Replace(strings.Join(base, "\n\n"), "internal/poll.runtime_pollWait(0x7f, 0x72)", "sync.(*Cond).Wait(0xc)", 1))
	if got := same.More(base); got != "" {
		t.Errorf("More of the same goroutines = %q, want nothing", got)
	}
	now := append(Goroutines{}, base[0], base[1], `goroutine 40 [IO wait]:
github.com/corral-dev/corral/ipc.(*conn).serve(0xc009)
	/src/ipc/conn.go:140 +0x1
created by github.com/corral-dev/corral/ipc.(*Server).Serve in goroutine 5
	/src/ipc/server.go:190 +0x1`, `goroutine 41 [sync.Cond.Wait]:
github.com/corral-dev/corral/ipc.(*outQueue).pop(0xc010)
	/src/ipc/queue.go:110 +0x8b
github.com/corral-dev/corral/ipc.(*conn).writeLoop(0xc011)
	/src/ipc/conn.go:174 +0x5d
created by github.com/corral-dev/corral/ipc.(*conn).serve in goroutine 40
	/src/ipc/conn.go:134 +0x85`)
	got := now.More(base)
	for _, want := range []string{
		"1 more: ipc.(*conn).serve, created by ipc.(*Server).Serve, e.g.\ngoroutine 40 [IO wait]:",
		"1 more: ipc.(*conn).writeLoop, created by ipc.(*conn).serve, e.g.\ngoroutine 41 [sync.Cond.Wait]:",
		"1 fewer: os/signal.loop, created by os/signal.Notify.func1.1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("More =\n%s\nwant it to say %q", got, want)
		}
	}
	if strings.Contains(got, "main.main") {
		t.Errorf("More =\n%s\nnames main.main, of which there is one at both", got)
	}
	if i, j := strings.Index(got, "more:"), strings.Index(got, "fewer:"); i < 0 || j < i {
		t.Errorf("More =\n%s\nwant the goroutines there are more of first", got)
	}
}

// TestMetricsConnLeftOut: the goroutines of the metrics endpoint's
// connections (the reads' own) are told by what created them, the
// background reader even before it has run; others are not.
func TestMetricsConnLeftOut(t *testing.T) {
	for stack, want := range map[string]bool{
		`goroutine 23 [running]:
runtime/pprof.writeGoroutineStacks({0x1044c80, 0x2020fc5b8870})
	/usr/local/go/src/runtime/pprof/pprof.go:819 +0x6b
net/http.(*conn).serve(0x2020fc61c090, {0x104cc18, 0x2020fc56fec0})
	/usr/local/go/src/net/http/server.go:2067 +0x690
created by net/http.(*Server).Serve in goroutine 45
	/usr/local/go/src/net/http/server.go:3464 +0x485`: true,
		`goroutine 50 [runnable]:
net/http.(*connReader).startBackgroundRead.gowrap2()
	/usr/local/go/src/net/http/server.go:698
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1
created by net/http.(*connReader).startBackgroundRead in goroutine 23
	/usr/local/go/src/net/http/server.go:698 +0xb6`: true,
		`goroutine 44 [IO wait]:
github.com/corral-dev/corral/metrics.Serve.func1()
	/src/metrics/metrics.go:242 +0x1
created by github.com/corral-dev/corral/metrics.Serve in goroutine 1
	/src/metrics/metrics.go:240 +0x1`: false,
		`goroutine 40 [IO wait]:
github.com/corral-dev/corral/ipc.(*conn).serve(0xc009)
	/src/ipc/conn.go:140 +0x1
created by github.com/corral-dev/corral/ipc.(*Server).accept in goroutine 5
	/src/ipc/server.go:190 +0x1`: false,
	} {
		if got := metricsConn(stack); got != want {
			t.Errorf("metricsConn = %t, want %t, for\n%s", got, want, stack)
		}
	}
	if got := kind("goroutine 50 [runnable]:\nnet/http.(*connReader).startBackgroundRead.gowrap2()\n\t/x.go:1\nruntime.goexit({})\n\t/y.s:1 +0x1\ncreated by net/http.(*connReader).startBackgroundRead in goroutine 23\n\t/x.go:1 +0xb6"); got != "net/http.(*connReader).startBackgroundRead.gowrap2, created by net/http.(*connReader).startBackgroundRead" {
		t.Errorf("kind of a goroutine not yet run = %q", got)
	}
}
