package drill

import (
	"strings"
	"testing"
)

// TestCorralGoroutines: from a SIGQUIT dump, only the goroutines with a
// frame of corral's code are quoted, with their headers.
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
	if !strings.Contains(got, "goroutine 1 [select]") || !strings.Contains(got, "goroutine 9 [IO wait]") || strings.Contains(got, "goroutine 7") {
		t.Errorf("corralGoroutines =\n%s\nwant goroutines 1 and 9, not 7", got)
	}
	if got := corralGoroutines(log, 10); !strings.Contains(got, "more left out") {
		t.Errorf("corralGoroutines over its bound = %q, want it to say more was left out", got)
	}
}
