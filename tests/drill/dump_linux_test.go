package drill

import (
	"strings"
	"testing"
)

// TestCorralGoroutines: from a SIGQUIT dump every goroutine is quoted with
// its header, those with a frame of corral's code first.
func TestCorralGoroutines(t *testing.T) {
	log := `{"level":"info","message":"x"}
SIGQUIT: quit
PC=0x0 m=0 sigcode=0

goroutine 1 [select]:
github.com/corral-dev/corral/ipc.(*conn).serve(0xc000)
	/src/ipc/conn.go:140 +0x1

goroutine 7 [chan receive]:
os/signal.loop()
	/usr/local/go/src/os/signal/signal_unix.go:23 +0x1

goroutine 9 [IO wait]:
github.com/corral-dev/corral/reactor.(*Reactor).Run(0xc001)
	/src/reactor/reactor.go:200 +0x1
`
	got := corralGoroutines(log, 1000)
	i1, i9, i7 := strings.Index(got, "goroutine 1 [select]"), strings.Index(got, "goroutine 9 [IO wait]"), strings.Index(got, "goroutine 7 [chan receive]")
	if i1 < 0 || i9 < 0 || i7 < 0 || i7 < i9 {
		t.Errorf("corralGoroutines =\n%s\nwant goroutines 1 and 9, then 7", got)
	}
	if got := corralGoroutines(log, 10); !strings.Contains(got, "more left out") {
		t.Errorf("corralGoroutines over its bound = %q, want it to say more was left out", got)
	}
}
