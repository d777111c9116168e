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
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
)

// DefaultSocketPath is where corrald listens unless told otherwise.
const DefaultSocketPath = "/run/corral/corrald.sock"

// SocketEnv names the environment variable that overrides the socket path.
const SocketEnv = "CORRAL_SOCKET"

// maxClientLine bounds one message the client accepts from the daemon.
// Responses are not limited to api.MaxLineBytes (exec.list can be large), but
// a line this long means something is wrong.
const maxClientLine = 64 << 20

// ErrClosed is wrapped by the errors of calls on a Client whose connection is
// gone (closed by Close, by the daemon, or broken).
var ErrClosed = errors.New("connection to corrald closed")

// DefaultSocket returns $CORRAL_SOCKET, or DefaultSocketPath when it is unset
// or empty.
func DefaultSocket() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	return DefaultSocketPath
}

// Client is a connection to corrald. It multiplexes any number of concurrent
// calls over one socket, matching responses by id.
//
// Ownership: safe for concurrent use by any goroutines. One reader goroutine,
// started by Dial, owns the read side: it delivers responses and calls the
// onNote funcs of Follow; writes are serialised by a mutex. Close ends it.
type Client struct {
	nc net.Conn

	wmu sync.Mutex // serialises writes of whole lines

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan clientReply
	subs    map[string]map[*subscriber]struct{} // execution id -> Follow callers
	err     error                               // why the connection ended
	done    chan struct{}                       // closed when the reader ends
}

type clientReply struct {
	result json.RawMessage
	err    *api.Error
}

type subscriber struct {
	mu   sync.Mutex // held while fn runs, so that Follow can wait it out
	done bool
	fn   func(method string, params json.RawMessage)
}

func (s *subscriber) deliver(method string, params json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.fn(method, params)
	}
}

func (s *subscriber) stop() {
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
}

// clientRequest is a request or, without ID, a notification.
type clientRequest struct {
	JSONRPC string  `json:"jsonrpc"`
	ID      *uint64 `json:"id,omitempty"`
	Method  string  `json:"method"`
	Params  any     `json:"params,omitempty"`
}

// clientMessage is anything the daemon sends.
type clientMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    api.Code `json:"code"`
		Message string   `json:"message"`
	} `json:"error"`
}

// Dial connects to corrald's socket at path.
func Dial(path string) (*Client, error) {
	return DialContext(context.Background(), path)
}

// DialContext connects to corrald's socket at path, giving up when ctx ends.
func DialContext(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to corrald: %w", err) // "dial unix PATH: ...", from net
	}
	return NewClient(nc), nil
}

// NewClient runs the protocol over an established connection, which the
// Client then owns.
func NewClient(nc net.Conn) *Client {
	c := &Client{
		nc:      nc,
		pending: make(map[uint64]chan clientReply),
		subs:    make(map[string]map[*subscriber]struct{}),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// Close closes the connection; calls in progress fail with ErrClosed. It
// may be called more than once.
func (c *Client) Close() error {
	err := c.nc.Close()
	<-c.done
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close corrald connection: %w", err)
	}
	return nil
}

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is open.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Call sends method with params and decodes the result into result (unless
// result is nil). A JSON-RPC error is returned as *api.Error with Code and
// Message. When ctx ends first Call returns ctx.Err(); the daemon still
// completes the request and its response is discarded.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", method, err)
	}
	c.next++
	id := c.next
	ch := make(chan clientReply, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}

	if err := c.send(clientRequest{JSONRPC: version, ID: &id, Method: method, Params: params}); err != nil {
		forget()
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if result != nil {
			if err := json.Unmarshal(r.result, result); err != nil {
				return fmt.Errorf("%s: decode result: %w", method, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		return ctx.Err()
	case <-c.done:
		select {
		case r := <-ch: // answered just before the end
			if r.err != nil {
				return r.err
			}
			if result != nil {
				if err := json.Unmarshal(r.result, result); err != nil {
					return fmt.Errorf("%s: decode result: %w", method, err)
				}
			}
			return nil
		default:
		}
		return fmt.Errorf("%s: %w", method, c.Err())
	}
}

// Notify sends a JSON-RPC notification: the daemon runs method and sends no
// response.
func (c *Client) Notify(method string, params any) error {
	if err := c.send(clientRequest{JSONRPC: version, Method: method, Params: params}); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

func (c *Client) send(req clientRequest) error {
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode params: %w", err)
	}
	if len(b) > api.MaxLineBytes {
		return fmt.Errorf("request is %d bytes, over the %d-byte limit", len(b), api.MaxLineBytes)
	}
	b = append(b, '\n')
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.nc.Write(b); err != nil {
		// The write failed (EPIPE, ECONNRESET): the connection is closed.
		// The reader, which sees the end at once, has the better reason
		// (what the daemon said before closing, e.g. -32003 at its
		// connection limit); wait for it a little.
		select {
		case <-c.done:
		case <-time.After(100 * time.Millisecond):
		}
		if e := c.Err(); e != nil {
			return e
		}
		return fmt.Errorf("send: %w: %w", ErrClosed, err)
	}
	return nil
}

// readLoop delivers responses and notifications until the connection ends.
func (c *Client) readLoop() {
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var lastErr string // a daemon error with a null id, e.g. before it closes
	var err error
	for {
		var line []byte
		line, err = readLine(br, maxClientLine)
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if id, result, ok := plainResponse(line); ok {
			c.deliver(id, clientReply{result: result})
			continue
		}
		var m clientMessage
		if json.Unmarshal(line, &m) != nil {
			continue // not ours to fix; the daemon only sends objects
		}
		if m.ID == nil || string(m.ID) == "null" {
			if m.Method != "" {
				c.deliverNote(m.Method, m.Params)
			} else if m.Error != nil {
				lastErr = fmt.Sprintf("%s (code %d)", m.Error.Message, m.Error.Code)
			}
			continue
		}
		id, perr := strconv.ParseUint(string(m.ID), 10, 64)
		if perr != nil {
			continue
		}
		r := clientReply{result: m.Result}
		if m.Error != nil {
			r.err = &api.Error{Code: m.Error.Code, Message: m.Error.Message}
		}
		c.deliver(id, r)
	}
	switch {
	case lastErr != "":
		err = fmt.Errorf("%w: daemon said: %s", ErrClosed, lastErr)
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
		err = ErrClosed
	default:
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.mu.Lock()
	c.err = err
	c.pending = map[uint64]chan clientReply{}
	c.mu.Unlock()
	close(c.done)
}

// deliver hands r to the call waiting for the response with id, if it
// still waits.
func (c *Client) deliver(id uint64, r clientReply) {
	c.mu.Lock()
	ch := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ch != nil { // else the caller gave up
		ch <- r
	}
}

// plainResponse reads a successful response in the layout the daemon writes
// it (ipc's encodeResult): {"jsonrpc":"2.0","id":N,"result":R}, N a
// decimal id, nothing else. It returns N and R's bytes (aliasing line)
// without decoding the line: the call decodes R once, into its result, so
// an answer is not scanned and copied twice on its way (the envelope's
// decode cost more than the record's: about 31 against 27 µs for an
// exec.wait answer on the build host). ok is false for anything else (an
// error, a notification, another layout), which the caller decodes in
// full. R must be valid JSON: then the line is exactly that object (a
// member after R would make R invalid).
func plainResponse(line []byte) (id uint64, result json.RawMessage, ok bool) {
	const head, mid = `{"jsonrpc":"` + version + `","id":`, `,"result":`
	line = bytes.TrimRight(line, "\r\n")
	if !bytes.HasPrefix(line, []byte(head)) || line[len(line)-1] != '}' {
		return 0, nil, false
	}
	rest := line[len(head) : len(line)-1]
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || !bytes.HasPrefix(rest[n:], []byte(mid)) {
		return 0, nil, false
	}
	id, err := strconv.ParseUint(string(rest[:n]), 10, 64)
	if err != nil {
		return 0, nil, false
	}
	result = rest[n+len(mid):]
	if !json.Valid(result) {
		return 0, nil, false
	}
	return id, result, true
}

// readLine reads one '\n'-terminated line of at most limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var long []byte
	for {
		frag, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(long)+len(frag) > limit {
				return nil, fmt.Errorf("message from daemon longer than %d bytes", limit)
			}
			long = append(long, frag...)
			continue
		}
		if err != nil {
			return nil, err
		}
		return append(long, frag...), nil
	}
}

// deliverNote hands a notification to the Follow calls of its execution.
func (c *Client) deliverNote(method string, params json.RawMessage) {
	var target struct {
		ID     string `json:"id"`
		Record struct {
			ID string `json:"id"`
		} `json:"record"`
	}
	if json.Unmarshal(params, &target) != nil {
		return
	}
	id := target.ID
	if id == "" {
		id = target.Record.ID
	}
	c.mu.Lock()
	var subs []*subscriber
	for s := range c.subs[id] {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		s.deliver(method, params)
	}
}

// Follow calls exec.follow and passes each notification about p.ID to onNote
// until the final record arrives. onNote runs on the Client's reader
// goroutine, so it must not block for long and must not make calls on this
// Client itself (hand the work to another goroutine). params belongs to
// onNote, which may keep it. Every notification the daemon sent before the
// response has been passed to onNote when Follow returns, and onNote is not
// called after Follow returns. Two Follows of the same id on one Client each see the other's
// notifications.
func (c *Client) Follow(ctx context.Context, p api.FollowParams, onNote func(method string, params json.RawMessage)) (api.Record, error) {
	s := &subscriber{fn: onNote}
	c.mu.Lock()
	if c.subs[p.ID] == nil {
		c.subs[p.ID] = make(map[*subscriber]struct{})
	}
	c.subs[p.ID][s] = struct{}{}
	c.mu.Unlock()
	defer func() {
		s.stop()
		c.mu.Lock()
		delete(c.subs[p.ID], s)
		if len(c.subs[p.ID]) == 0 {
			delete(c.subs, p.ID)
		}
		c.mu.Unlock()
	}()
	var rec api.Record
	err := c.Call(ctx, "exec.follow", p, &rec)
	return rec, err
}

// Start calls exec.start.
func (c *Client) Start(ctx context.Context, p api.StartParams) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.start", p)
}

// Get calls exec.get.
func (c *Client) Get(ctx context.Context, id string) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.get", api.IDParams{ID: id})
}

// Wait calls exec.wait.
func (c *Client) Wait(ctx context.Context, p api.WaitParams) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.wait", p)
}

// Cancel calls exec.cancel.
func (c *Client) Cancel(ctx context.Context, p api.CancelParams) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.cancel", p)
}

// Signal calls exec.signal.
func (c *Client) Signal(ctx context.Context, p api.SignalParams) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.signal", p)
}

// Write calls exec.write.
func (c *Client) Write(ctx context.Context, p api.WriteParams) (api.WriteResult, error) {
	return callAs[api.WriteResult](ctx, c, "exec.write", p)
}

// List calls exec.list.
func (c *Client) List(ctx context.Context, p api.ListParams) (api.ListResult, error) {
	return callAs[api.ListResult](ctx, c, "exec.list", p)
}

// Output calls exec.output.
func (c *Client) Output(ctx context.Context, p api.OutputParams) (api.OutputResult, error) {
	return callAs[api.OutputResult](ctx, c, "exec.output", p)
}

// Info calls daemon.info.
func (c *Client) Info(ctx context.Context) (api.Info, error) {
	return callAs[api.Info](ctx, c, "daemon.info", nil)
}

// callAs makes one call and decodes its result into a T.
func callAs[T any](ctx context.Context, c *Client, method string, params any) (T, error) {
	var r T
	return r, c.Call(ctx, method, params, &r)
}

// Update calls exec.update.
func (c *Client) Update(ctx context.Context, p api.UpdateParams) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.update", p)
}

// Resize calls exec.resize.
func (c *Client) Resize(ctx context.Context, p api.ResizeParams) (api.Record, error) {
	return callAs[api.Record](ctx, c, "exec.resize", p)
}
