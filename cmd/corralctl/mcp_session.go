package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// mcpSession is what one `corralctl mcp` process (one MCP session on
// stdio) keeps: its connection to corrald, redialled when it breaks, and
// how far it has read each execution's output.
//
// Ownership: safe for concurrent use; tool calls run on the SDK's
// goroutines. mu guards everything below it.
type mcpSession struct {
	socket string

	mu      sync.Mutex
	client  *ipc.Client
	offsets map[string]*readOffsets // execution id -> where this session last read
	started []string                // ids this session started, for --cancel-on-exit
}

// readOffsets is where a session's next read of each stream starts.
type readOffsets struct{ stdout, stderr int64 }

// Reconnection bounds: a restarting corrald (handover, crash and restart by
// systemd) is back within a second or two; longer than that the tool result
// says corrald is down.
const (
	redialFor   = 3 * time.Second
	redialEvery = 100 * time.Millisecond
)

func newMCPSession(socket string) *mcpSession {
	return &mcpSession{socket: socket, offsets: make(map[string]*readOffsets)}
}

// conn returns the open connection to corrald, dialling a new one when
// there is none or the last one ended.
func (s *mcpSession) conn(ctx context.Context) (*ipc.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		select {
		case <-s.client.Done():
			s.client.Close()
			s.client = nil
		default:
			return s.client, nil
		}
	}
	c, err := ipc.DialContext(ctx, s.socket)
	if err != nil {
		return nil, err
	}
	s.client = c
	return c, nil
}

// drop forgets c if it is still the session's connection.
func (s *mcpSession) drop(c *ipc.Client) {
	s.mu.Lock()
	if s.client == c {
		s.client = nil
	}
	s.mu.Unlock()
	c.Close()
}

// call runs f on the connection to corrald. When the connection is broken
// or corrald is shutting down (-32005, a restart or handover), it redials
// and runs f again, for up to redialFor. Every f passed here must be safe to
// repeat: reads, and exec.start with a client-chosen id (an idempotency
// key), so a retried start never starts twice.
func (s *mcpSession) call(ctx context.Context, f func(c *ipc.Client) error) error {
	deadline := time.Now().Add(redialFor)
	for {
		c, err := s.conn(ctx)
		if err == nil {
			err = f(c)
			if err == nil || !retryable(err) {
				return err
			}
			s.drop(c)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(redialEvery):
		}
	}
}

// retryable reports errors after which a new connection may succeed.
func retryable(err error) bool {
	if errors.Is(err, ipc.ErrClosed) {
		return true
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code == api.CodeShuttingDown
	}
	// A dial that failed: corrald is not listening (yet).
	return errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "connection refused")
}

// offsetsOf returns the session's read offsets of id.
func (s *mcpSession) offsetsOf(id string) readOffsets {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.offsets[id]; o != nil {
		return *o
	}
	return readOffsets{}
}

// advance moves the session's read offsets of id forward (never back).
func (s *mcpSession) advance(id string, o readOffsets) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.offsets[id]
	if cur == nil {
		cur = &readOffsets{}
		s.offsets[id] = cur
	}
	cur.stdout = max(cur.stdout, o.stdout)
	cur.stderr = max(cur.stderr, o.stderr)
}

func (s *mcpSession) noteStarted(id string) {
	s.mu.Lock()
	s.started = append(s.started, id)
	s.mu.Unlock()
}

// close ends the session: with cancelOwn, it first cancels the executions
// the session started that are still running (bounded by ctx).
func (s *mcpSession) close(ctx context.Context, cancelOwn bool) {
	if cancelOwn {
		s.mu.Lock()
		ids := append([]string(nil), s.started...)
		s.mu.Unlock()
		for _, id := range ids {
			_ = s.call(ctx, func(c *ipc.Client) error {
				_, err := c.Cancel(ctx, api.CancelParams{ID: id, Reason: "corralctl mcp session ended"})
				return err
			})
		}
	}
	s.mu.Lock()
	c := s.client
	s.client = nil
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// toolError turns an error of a daemon call into the text of an isError
// tool result: what happened and what the caller can do about it.
func (s *mcpSession) toolError(what, id string, err error) error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae) && ae.Code == api.CodeNotFound:
		return fmt.Errorf("%s: no execution %q is visible to you (it does not exist, is another user's, or its record has expired); call list_executions to see yours", what, id)
	case errors.As(err, &ae) && ae.Code == api.CodeInvalidParams:
		return fmt.Errorf("%s: corrald rejected the arguments: %s; fix that argument and call again", what, ae.Message)
	case errors.As(err, &ae) && ae.Code == api.CodeOverCapacity:
		return fmt.Errorf("%s: corrald is at capacity (%s); nothing was started: wait for or cancel running executions (list_executions) and call again", what, ae.Message)
	case errors.As(err, &ae) && ae.Code == api.CodeShuttingDown:
		return fmt.Errorf("%s: corrald is restarting (%s); call the tool again in a few seconds", what, ae.Message)
	case errors.As(err, &ae) && ae.Code == api.CodePermission:
		return fmt.Errorf("%s: permission denied by corrald: %s", what, ae.Message)
	case errors.As(err, &ae):
		return fmt.Errorf("%s: corrald answered error %d: %s", what, ae.Code, ae.Message)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %v", what, err)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: cannot connect to corrald: %v", what, withSocketHint(err, s.socket))
	case retryable(err):
		return fmt.Errorf("%s: corrald is not reachable at %s (%v): it is down or restarting; "+
			"executions already started keep running. Start corrald (systemctl start corrald) or set CORRAL_SOCKET, then call the tool again", what, s.socket, err)
	}
	return fmt.Errorf("%s: %v", what, err)
}
