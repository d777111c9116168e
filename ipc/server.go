package ipc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
)

// Default per-connection limits of a Server.
const (
	DefaultMaxInFlight    = 128     // requests being handled per connection
	DefaultNoteQueueLen   = 256     // queued notifications per connection
	DefaultNoteQueueBytes = 4 << 20 // bytes of queued notifications per connection
	DefaultMaxConns       = 1024    // open connections per Server
	DefaultMaxParked      = 1024    // exec.output calls parked (wait_ms) per connection
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("ipc: server closed")

// Server serves corral's JSON-RPC 2.0 protocol on Unix stream sockets and
// dispatches every request to a Service with the caller's SO_PEERCRED
// identity (read once, at accept). The method table is in methods.go.
//
// Wire behaviour, beyond plain JSON-RPC 2.0:
//   - One message per '\n'-terminated line; blank lines are ignored, and an
//     unterminated last line before EOF is still a message. A line over
//     api.MaxLineBytes is answered -32600 (id null) and that connection
//     alone is closed (after half-closing, so the peer reads the error and
//     then EOF).
//   - Errors: -32700 invalid JSON; -32600 not an object, empty batch, wrong
//     "jsonrpc", id not a string/number/null, method not a string; -32601
//     unknown method; -32602 params not an object or a field of the wrong
//     type: the message is "params.<field>: want <type>" and error.data is
//     {"field": "<field>"}; a Service *api.Error gives its Code and Message
//     (never its Err), and for -32602 error.data {"field"} too when its
//     message starts with one ("timeout_ms: must not be negative"); anything else, panics included, is -32603 "internal
//     error". The connection carries on after all of these.
//   - Requests with an id, including id null, are answered; notifications
//     (no id) are run and never answered, even when they fail.
//   - Batches run their elements concurrently and answer one array without
//     the notifications' entries (nothing at all when only notifications).
//   - Responses are never dropped; daemon notifications (exec.follow) are
//     dropped when the connection's notification queue is full.
//   - After read EOF the requests in flight still finish and are answered
//     (a peer may have shut down only its write side); when the peer has
//     closed the socket entirely, their context is cancelled.
//
// Ownership: Serve runs the accept loop on the caller's goroutine; each
// connection then has one reader goroutine (framing, validation, dispatch),
// one writer goroutine (the only one that writes to the socket, responses and
// notifications in order) and one goroutine per request in flight, except
// exec.output calls parked in an OutputWaiter, which hold none. The limit
// fields may be set only before the first Serve. Shutdown may be called from
// any goroutine, once.
type Server struct {
	// MaxInFlight bounds the requests handled at once per connection; beyond
	// it, and while as many responses wait for the writer, the connection is
	// not read.
	MaxInFlight int
	// NoteQueueLen and NoteQueueBytes bound the notifications queued per
	// connection; more are dropped (notify returns false).
	NoteQueueLen   int
	NoteQueueBytes int
	// MaxConns bounds the open connections; one more is answered with a
	// -32003 error (id null) and closed. 0 means no limit.
	MaxConns int
	// MaxParked bounds the exec.output calls with wait_ms parked in the
	// service per connection, holding no goroutine (see OutputWaiter);
	// beyond it a call waits on its own goroutine and in-flight slot.
	MaxParked int

	svc Service
	log zerolog.Logger

	mu        sync.Mutex
	listeners map[*net.UnixListener]struct{}
	conns     map[*conn]struct{}
	closing   bool
	wg        sync.WaitGroup // one per connection goroutine
}

// NewServer returns a Server that dispatches to svc and logs to log.
func NewServer(svc Service, log zerolog.Logger) *Server {
	return &Server{
		MaxInFlight:    DefaultMaxInFlight,
		NoteQueueLen:   DefaultNoteQueueLen,
		NoteQueueBytes: DefaultNoteQueueBytes,
		MaxConns:       DefaultMaxConns,
		MaxParked:      DefaultMaxParked,
		svc:            svc,
		log:            log,
		listeners:      make(map[*net.UnixListener]struct{}),
		conns:          make(map[*conn]struct{}),
	}
}

// Serve accepts connections on l until Shutdown (then it returns
// ErrServerClosed) or a permanent accept error. Serve does not close l on a
// permanent error; Shutdown does close it. Serve may be called for several
// listeners at once.
func (s *Server) Serve(l *net.UnixListener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := l.AcceptUnix()
		if err != nil {
			if s.isClosing() {
				return ErrServerClosed
			}
			if temporaryAcceptError(err) {
				// Out of fds or memory: wait and retry rather than spin or
				// give up, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("accept failed")
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept on %s: %w", l.Addr(), err)
		}
		backoff = 0
		s.startConn(nc)
	}
}

func temporaryAcceptError(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// startConn reads the peer's credentials and starts the connection's
// goroutines. A connection whose credentials cannot be read is closed: it
// could not be authorised.
func (s *Server) startConn(nc *net.UnixConn) {
	owner, err := peerCred(nc)
	if err != nil {
		s.log.Error().Err(err).Msg("read peer credentials; closing connection")
		_ = nc.Close()
		return
	}
	c := newConn(s, nc, owner)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	if s.MaxConns > 0 && len(s.conns) >= s.MaxConns {
		s.mu.Unlock()
		s.log.Warn().Uint32("uid", owner.UID).Int32("peer_pid", owner.PID).Int("max_conns", s.MaxConns).Msg("too many connections; refusing one")
		// Best effort and bounded: the peer learns why before the close.
		_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = nc.Write(encodeLine(encodeError(nullID, wireError{Code: api.CodeOverCapacity, Message: "too many connections"})))
		_ = nc.Close()
		c.cancel()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
}

// Shutdown closes every listener and every connection; the context passed to
// in-flight Service calls is cancelled and their responses are discarded. It
// waits for the connection goroutines to end, or for ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		_ = l.Close()
	}
	for c := range s.conns {
		c.abort()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ipc shutdown: %w", ctx.Err())
	}
}
