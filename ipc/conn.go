package ipc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
)

// readBufSize is the reader's buffer. A line longer than it is accumulated
// separately up to api.MaxLineBytes, so a connection never holds more than
// about MaxLineBytes+readBufSize of unparsed input.
const readBufSize = 64 << 10

// drainTimeout bounds how long a closing connection waits for the peer to
// take the responses still queued for it.
const drainTimeout = 10 * time.Second

// After an oversize line, at most this much more input is read (and
// discarded) before the connection is closed.
const (
	oversizeDiscardBytes = 4 << 20
	oversizeDiscardTime  = time.Second
)

// conn is one client connection.
//
// Ownership: serve runs the reader on the connection goroutine; writeLoop is
// the only writer of nc; request goroutines only push to out. ctx is
// cancelled when the connection is gone, which ends exec.wait and
// exec.follow calls made for it.
type conn struct {
	srv    *Server
	nc     *net.UnixConn
	owner  api.Owner
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	sem        chan struct{} // one token per request in flight
	parked     atomic.Int64  // calls parked in the service (see park)
	handlers   sync.WaitGroup
	out        *outQueue
	writerDone chan struct{}
}

func newConn(s *Server, nc *net.UnixConn, owner api.Owner) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	inflight := s.MaxInFlight
	if inflight <= 0 {
		inflight = DefaultMaxInFlight
	}
	c := &conn{
		srv:        s,
		nc:         nc,
		owner:      owner,
		log:        s.log.With().Uint32("uid", owner.UID).Int32("peer_pid", owner.PID).Logger(),
		ctx:        ctx,
		cancel:     cancel,
		sem:        make(chan struct{}, inflight),
		out:        newOutQueue(max(s.NoteQueueLen, 1), max(s.NoteQueueBytes, 1)),
		writerDone: make(chan struct{}),
	}
	if nc == nil {
		return c // a test of dispatch alone
	}
	if rc, err := nc.SyscallConn(); err == nil {
		c.out.direct = func(b []byte) int { return writeNonblocking(rc, b) }
	}
	return c
}

// writeNonblocking writes as much of b to the socket as it takes now (the
// netpoller keeps it non-blocking) and returns how much that was: 0 on
// EAGAIN, a write deadline passed or an error, which the writer goroutine
// then meets itself.
func writeNonblocking(rc syscall.RawConn, b []byte) int {
	n := 0
	_ = rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			// syscall's, not x/sys's: under -race it orders this write
			// before the peer's read as net's own writes are (both go
			// through syscall's ioSync).
			m, err := syscall.Write(int(fd), b[n:])
			if m > 0 {
				n += m
			}
			if err == syscall.EINTR {
				continue
			}
			if err != nil || m <= 0 {
				break
			}
		}
		return true // never wait for room: the writer does
	})
	return n
}

// abort closes the connection now: pending responses are discarded and
// in-flight calls cancelled. Any goroutine may call it.
func (c *conn) abort() {
	// Close the queue before cancelling, so that the answers of calls ended
	// by the cancel ("internal error") are not sent.
	c.out.close()
	c.cancel()
	_ = c.nc.Close()
}

type readEnd int

const (
	readEOF      readEnd = iota // the peer stopped sending
	readOversize                // a line was too long; the error is queued
	readFailed                  // the socket broke or was closed by us
)

// serve runs the connection to its end and releases everything it holds.
func (c *conn) serve() {
	c.log.Debug().Msg("connection opened")
	go c.writeLoop()

	switch c.readLoop() {
	case readEOF:
		// The peer may have only shut down its write side and still want
		// the answers: let the requests in flight finish, but cancel them if
		// the peer turns out to be gone altogether.
		stop := c.watchHangup()
		c.handlers.Wait()
		stop()
		_ = c.nc.SetWriteDeadline(time.Now().Add(drainTimeout))
		c.out.seal()
	case readOversize:
		// The -32600 is queued; send it and whatever precedes it, then close.
		_ = c.nc.SetWriteDeadline(time.Now().Add(drainTimeout))
		c.out.seal()
		c.cancel()
		c.handlers.Wait()
		<-c.writerDone
		// The peer reads the error and then EOF. Swallow a bounded amount of
		// what it is still sending: closing a socket with unread input makes
		// the peer's next read fail with ECONNRESET instead of EOF.
		_ = c.nc.CloseWrite()
		_ = c.nc.SetReadDeadline(time.Now().Add(oversizeDiscardTime))
		_, _ = io.CopyN(io.Discard, c.nc, oversizeDiscardBytes)
	case readFailed:
		c.abort()
		c.handlers.Wait()
	}
	<-c.writerDone
	c.cancel()
	_ = c.nc.Close()
	c.log.Debug().Uint64("dropped_notifications", c.out.droppedNotes()).Msg("connection closed")
}

// writeLoop is the connection's only writer. On a write error it aborts the
// connection, which also ends the reader.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	for {
		it, ok := c.out.pop()
		if !ok {
			return
		}
		_, err := c.nc.Write(it.b)
		c.out.written()
		if err != nil {
			c.log.Debug().Err(err).Msg("write failed; closing connection")
			c.abort()
			return
		}
	}
}

// readLoop reads '\n'-terminated messages and dispatches them until the peer
// stops, the socket fails or a line is too long.
func (c *conn) readLoop() readEnd {
	br := bufio.NewReaderSize(c.nc, readBufSize)
	var long []byte // a line longer than the buffer, being accumulated
	for {
		// Pause reading while the peer does not take its responses.
		if !c.out.waitRoom(cap(c.sem)) {
			return readFailed
		}
		frag, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			frag = frag[:len(frag)-1]
		case errors.Is(err, bufio.ErrBufferFull):
			if len(long)+len(frag) > api.MaxLineBytes {
				c.oversize()
				return readOversize
			}
			long = append(long, frag...)
			continue
		case errors.Is(err, io.EOF):
			// An unterminated last line is still a message.
			if len(long)+len(frag) > 0 && len(long)+len(frag) <= api.MaxLineBytes {
				c.dispatchLine(append(long, frag...))
			} else if len(long)+len(frag) > api.MaxLineBytes {
				c.oversize()
				return readOversize
			}
			return readEOF
		default:
			if c.ctx.Err() == nil {
				c.log.Debug().Err(err).Msg("read failed")
			}
			return readFailed
		}
		var line []byte
		if long != nil {
			line = append(long, frag...)
			long = nil
		} else {
			line = bytes.Clone(frag) // frag is the reader's buffer
		}
		if len(line) > api.MaxLineBytes {
			c.oversize()
			return readOversize
		}
		c.dispatchLine(line)
	}
}

func (c *conn) oversize() {
	c.log.Warn().Int("limit", api.MaxLineBytes).Msg("request line too long; closing connection")
	c.out.pushResponse(encodeLine(encodeError(nullID, wireError{
		Code:    api.CodeInvalidRequest,
		Message: fmt.Sprintf("invalid request: line longer than %d bytes", api.MaxLineBytes),
	})))
}

func encodeLine(b []byte) []byte { return append(b, '\n') }

// dispatchLine handles one message: a request, a notification or a batch.
// line is owned by the callee from now on.
func (c *conn) dispatchLine(line []byte) {
	first := firstByte(line)
	if first == 0 {
		return // blank line
	}
	if !json.Valid(line) {
		c.out.pushResponse(encodeLine(encodeError(nullID, wireError{Code: api.CodeParseError, Message: "parse error: invalid JSON"})))
		return
	}
	if first != '[' {
		c.dispatchOne(line, func(resp []byte) {
			if resp != nil {
				c.out.pushResponse(encodeLine(resp))
			}
		})
		return
	}

	var elems []json.RawMessage
	if err := json.Unmarshal(line, &elems); err != nil || len(elems) == 0 {
		c.out.pushResponse(encodeLine(encodeError(nullID, wireError{Code: api.CodeInvalidRequest, Message: "invalid request: empty batch"})))
		return
	}
	results := make([][]byte, len(elems))
	var batch sync.WaitGroup
	for i, e := range elems {
		batch.Add(1)
		if !c.dispatchOne(e, func(resp []byte) {
			results[i] = resp
			batch.Done()
		}) {
			batch.Done()
		}
	}
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		batch.Wait()
		var buf bytes.Buffer
		buf.WriteByte('[')
		for _, r := range results {
			if r == nil {
				continue
			}
			if buf.Len() > 1 {
				buf.WriteByte(',')
			}
			buf.Write(r)
		}
		if buf.Len() == 1 {
			return // only notifications: no response at all
		}
		buf.WriteString("]\n")
		c.out.pushResponse(buf.Bytes())
	}()
}

// dispatchOne validates one request and runs it, on its own goroutine once
// an in-flight slot is free (the reader waits for one). done receives the
// encoded response, or nil for a notification; it is called exactly once
// unless dispatchOne returns false (the connection is closing).
func (c *conn) dispatchOne(raw json.RawMessage, done func([]byte)) bool {
	call, id, rerr := parseRequest(raw)
	if rerr != nil {
		if call != nil && call.notification() {
			// A well-formed notification with bad params: no response.
			c.log.Debug().Str("method", call.method).Str("error", rerr.msg).Msg("notification rejected")
			done(nil)
			return true
		}
		done(encodeError(id, errorToWire(rerr)))
		return true
	}
	select {
	case c.sem <- struct{}{}:
	case <-c.ctx.Done():
		return false
	}
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		defer func() { <-c.sem }()
		if resp, parked := c.handle(call, done); !parked {
			done(resp)
		}
	}()
	return true
}

// handle runs one validated call and returns its encoded response (nil for a
// notification). When the handler parked the call (errParked), handle
// returns parked true and the response goes to done later, from the
// goroutine that answers it.
func (c *conn) handle(call *call, done func([]byte)) (resp []byte, parked bool) {
	start := time.Now()
	var (
		result any
		err    error
	)
	h, ok := methods[call.method]
	if !ok {
		err = &rpcError{code: api.CodeMethodNotFound, msg: "method not found: " + call.method}
	} else {
		// notify is exec.follow's; once the handler has returned it refuses,
		// so every notification accepted precedes the response in the queue.
		var (
			nmu      sync.Mutex
			finished bool
		)
		rc := &reqContext{svc: c.srv.svc, caller: c.owner}
		rc.notify = func(method string, params any) bool {
			nmu.Lock()
			defer nmu.Unlock()
			if finished {
				return false
			}
			return c.pushNote(method, params)
		}
		rc.park = func() func(any, error) { return c.park(call, start, done) }
		result, err = c.invoke(h, rc, call)
		nmu.Lock()
		finished = true
		nmu.Unlock()
		if errors.Is(err, errParked) {
			return nil, true
		}
	}
	return c.respond(call, start, result, err), false
}

// respond encodes call's answer (nil for a notification) and logs it.
func (c *conn) respond(call *call, start time.Time, result any, err error) []byte {
	var resp []byte
	if err == nil && !call.notification() {
		resp, err = encodeResult(call.id, result)
		if err != nil {
			err = fmt.Errorf("%s: %w", call.method, err)
		}
	}
	ev := c.log.Debug()
	if err != nil {
		w := c.wireErrorFor(call.method, err)
		ev = ev.Int("code", int(w.Code))
		if !call.notification() {
			resp = encodeError(call.id, w)
		}
	}
	ev.Str("method", call.method).Dur("duration", time.Since(start)).Bool("notification", call.notification()).Msg("request")
	if call.notification() {
		return nil
	}
	return resp
}

// park reserves a parked slot for call and returns the function that
// answers it, or nil when the connection already has MaxParked parked
// calls. A parked call counts as a handler until it is answered (so a
// half-closed connection still delivers it) but holds no in-flight slot
// and no goroutine.
func (c *conn) park(call *call, start time.Time, done func([]byte)) func(any, error) {
	max := c.srv.MaxParked
	if max <= 0 {
		max = DefaultMaxParked
	}
	if c.parked.Add(1) > int64(max) {
		c.parked.Add(-1)
		return nil
	}
	c.handlers.Add(1)
	var once sync.Once
	return func(result any, err error) {
		once.Do(func() {
			done(c.respond(call, start, result, err))
			c.parked.Add(-1)
			c.handlers.Done()
		})
	}
}

// invoke calls h, turning a panic into an internal error so that nothing a
// client sends can crash the daemon.
func (c *conn) invoke(h handler, rc *reqContext, call *call) (result any, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error().Str("method", call.method).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("request handler panicked")
			// Already logged with its stack; the client sees -32603.
			result, err = nil, &api.Error{Code: api.CodeInternal, Message: "internal error", Err: fmt.Errorf("%s: panic: %v", call.method, r)}
		}
	}()
	return h(c.ctx, rc, call.params)
}

// wireErrorFor maps a handler error to what the client sees, logging the
// detail it does not see.
func (c *conn) wireErrorFor(method string, err error) wireError {
	var ae *api.Error
	if errors.As(err, &ae) {
		if ae.Err != nil {
			c.log.Debug().Str("method", method).Err(ae.Err).Int("code", int(ae.Code)).Msg("request failed")
		}
		w := wireError{Code: ae.Code, Message: ae.Message}
		if ae.Code == api.CodeInvalidParams {
			// Invalid params name their field first ("timeout_ms: must
			// not be negative"); error.data.field names it, as for a
			// field of the wrong type (docs/protocol.md, error codes).
			if f := leadingField(ae.Message); f != "" {
				w.Data = errorData{Field: f}
			}
		}
		return w
	}
	var re *rpcError
	if errors.As(err, &re) {
		return errorToWire(re)
	}
	if c.ctx.Err() != nil {
		c.log.Debug().Str("method", method).Err(err).Msg("request ended by disconnect")
	} else {
		c.log.Error().Str("method", method).Err(err).Msg("request failed")
	}
	return wireError{Code: api.CodeInternal, Message: "internal error"}
}

// leadingField is the field an invalid-params message starts with: the text
// before its first ": ", without a "params." prefix, when that is a field
// path (letters, digits, '_', '.', and [N] indexes, as "argv[1]" or
// "tty_size.rows"); "" otherwise ("offset, limit: ..." names two).
func leadingField(msg string) string {
	f, _, ok := strings.Cut(msg, ": ")
	if !ok {
		return ""
	}
	f = strings.TrimPrefix(f, "params.")
	if f == "" {
		return ""
	}
	for i := 0; i < len(f); i++ {
		switch ch := f[i]; {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch == '_':
		case ch >= '0' && ch <= '9', ch == '.', ch == '[', ch == ']':
			if i == 0 {
				return ""
			}
		default:
			return ""
		}
	}
	return f
}

func errorToWire(e *rpcError) wireError {
	w := wireError{Code: e.code, Message: e.msg}
	if e.field != "" {
		w.Data = errorData{Field: e.field}
	}
	return w
}

// pushNote encodes and queues a notification without blocking. It encodes
// params before returning, so the caller may reuse its buffers afterwards.
func (c *conn) pushNote(method string, params any) bool {
	if !c.out.noteRoom() {
		c.out.countDrop()
		return false
	}
	b, err := encodeNote(method, params)
	if err != nil {
		c.log.Error().Err(err).Str("method", method).Msg("encode notification")
		return false
	}
	return c.out.pushNote(b)
}
