package ipc

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
)

// brokenWrites is a connection whose writes fail as on a socket the peer
// has closed (EPIPE) before our reader has seen the end.
type brokenWrites struct{ net.Conn }

func (brokenWrites) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// TestSendFailureIsErrClosed: a call whose request cannot be written (the
// peer closed, the reader has not noticed yet) fails with ErrClosed, as
// when the reader saw the close first: callers that go on across a corrald
// restart (corralctl's redial) test for ErrClosed alone.
func TestSendFailureIsErrClosed(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := NewClient(brokenWrites{a})
	defer c.Close()
	_, err := c.Get(context.Background(), "x")
	if !errors.Is(err, ErrClosed) || !errors.Is(err, syscall.EPIPE) {
		t.Errorf("Get over a connection whose writes fail = %v; want ErrClosed (and the EPIPE)", err)
	}
}
