package testd

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// DialLoop dials the unix socket every millisecond, closing each
// connection it gets, until the returned stop is called; stop reports the
// attempts and how many were refused (ECONNREFUSED, or ENOENT: no socket
// file), which is what a client of a daemon that hands its socket over
// (a reload, a restart from the fd store) must never see. stop may be
// called more than once (it stops the loop once, then reports the same);
// the test's cleanup calls it too, so the loop ends however the test does.
func DialLoop(t testing.TB, socket string) (stop func() (tries, refused int)) {
	var tries, refused atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-quit:
				return
			default:
			}
			tries.Add(1)
			conn, err := net.Dial("unix", socket)
			if err != nil {
				if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
					refused.Add(1)
				}
			} else {
				conn.Close()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var once sync.Once
	stop = func() (int, int) {
		once.Do(func() { close(quit); wg.Wait() })
		return int(tries.Load()), int(refused.Load())
	}
	t.Cleanup(func() { stop() })
	return stop
}
