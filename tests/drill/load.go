// Package drill runs corral's failure drills (issue 14): a mixed load of
// many clients against a real corrald while a fault is injected, then checks
// that every execution that was started has exactly one final record whose
// outcome matches what happened to it, that kept output equals what the
// child wrote, that nothing is left behind, and that the daemon still
// answers. The report (Row, Markdown) says per fault how many executions
// ran, how many went wrong, and how exec latency moved.
//
// The drills themselves are tests: tests/drill (faults on the host, a
// corrald from tests/testd) and tests/drill/systemd (faults of the service
// manager, corrald as a unit inside the private systemd of tests/harness).
// This file is the load; check.go the checks; report.go the report.
//
// Ownership: a Load's client goroutines are its own; the Phase they record
// into is safe for concurrent use.
package drill

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// Kind is one entry of the load's mix.
type Kind string

const (
	KindQuick      Kind = "quick"       // echo, waited for: the latency probe
	KindBig        Kind = "big"         // seq with megabytes of output, truncated to the limit
	KindStdin      Kind = "stdin"       // cat fed through exec.write, then closed
	KindTTY        Kind = "tty"         // a terminal (when the daemon supports tty: true)
	KindCancel     Kind = "cancel"      // a tree with a background child, cancelled at a random moment
	KindTimeout    Kind = "timeout"     // a sleep that hits its timeout_ms
	KindFollow     Kind = "follow"      // followed on a second connection that drops midway, resumed by offset
	KindSlowFollow Kind = "slow-follow" // followed by a connection that never reads
	KindVanish     Kind = "vanish"      // started by a client that closes with requests in flight
	KindFault      Kind = "fault"       // started by a fault itself (a stopped tree, a held pipe)
)

// Config is what a Load runs against.
type Config struct {
	Socket  string
	Clients int
	// Run marks everything of this drill run: the DRILL_RUN variable in
	// every child's environment (how leftover processes are found) and the
	// drill_run label.
	Run string
	// Seed makes the mix of each client repeatable.
	Seed uint64
	// TTY enables the terminal entry of the mix (Probe says whether the
	// daemon supports it).
	TTY bool
	// OutputLimit is output_limit_bytes of the big-output entry.
	OutputLimit int64
	// CallTimeout bounds one operation of a client, retries included.
	CallTimeout time.Duration
}

// Env is the environment every drill child gets.
func (c Config) Env(id string) map[string]string {
	return map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "DRILL_RUN": c.Run, "DRILL_EXEC": id}
}

// Load is N clients looping over the mix until Stop.
type Load struct {
	cfg    Config
	ph     *Phase
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   sync.Once
}

// StartLoad starts cfg.Clients clients recording into ph.
func StartLoad(cfg Config, ph *Phase) *Load {
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 90 * time.Second
	}
	if cfg.OutputLimit == 0 {
		cfg.OutputLimit = 64 << 10
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{cfg: cfg, ph: ph, cancel: cancel}
	for i := 0; i < cfg.Clients; i++ {
		cl := &client{cfg: cfg, ph: ph, n: i, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			cl.loop(ctx)
		}()
	}
	return l
}

// Stop tells the clients to stop and waits until each has finished the
// operation it was in.
// It may be called more than once.
func (l *Load) Stop() {
	l.stop.Do(func() {
		l.cancel()
		l.wg.Wait()
	})
}

// client is one load client: one connection (re-dialled when it breaks),
// one operation at a time.
type client struct {
	cfg Config
	ph  *Phase
	n   int
	rng *rand.Rand
	c   *ipc.Client
	seq int
}

// mix is the weighted list of kinds a client picks from.
var mix = []struct {
	k Kind
	w int
}{
	{KindQuick, 30}, {KindBig, 10}, {KindStdin, 10}, {KindTTY, 8}, {KindCancel, 12},
	{KindTimeout, 8}, {KindFollow, 10}, {KindSlowFollow, 4}, {KindVanish, 8},
}

func (cl *client) pick() Kind {
	total := 0
	for _, m := range mix {
		if m.k == KindTTY && !cl.cfg.TTY {
			continue
		}
		total += m.w
	}
	r := cl.rng.IntN(total)
	for _, m := range mix {
		if m.k == KindTTY && !cl.cfg.TTY {
			continue
		}
		if r < m.w {
			return m.k
		}
		r -= m.w
	}
	return KindQuick
}

func (cl *client) loop(ctx context.Context) {
	defer func() {
		if cl.c != nil {
			cl.c.Close()
		}
	}()
	for ctx.Err() == nil {
		k := cl.pick()
		cl.seq++
		id := fmt.Sprintf("drill-%s-%s-c%d-%d", cl.cfg.Run, cl.ph.Name, cl.n, cl.seq)
		opCtx, cancel := context.WithTimeout(context.Background(), cl.cfg.CallTimeout)
		cl.run(opCtx, k, id)
		cancel()
	}
}

// conn returns the client's connection, dialling (with retries until ctx
// ends) when there is none or it broke.
func (cl *client) conn(ctx context.Context) (*ipc.Client, error) {
	if cl.c != nil {
		select {
		case <-cl.c.Done():
			cl.c.Close()
			cl.c = nil
		default:
			return cl.c, nil
		}
	}
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := ipc.DialContext(dctx, cl.cfg.Socket)
		cancel()
		if err == nil {
			cl.c = c
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// call runs fn on the client's connection; when the connection breaks (the
// daemon went away, or a call hung past 20s) it re-dials and runs fn again,
// until ctx ends. A JSON-RPC error is returned as it is.
func (cl *client) call(ctx context.Context, fn func(ctx context.Context, c *ipc.Client) error) error {
	for {
		c, err := cl.conn(ctx)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = fn(cctx, c)
		cancel()
		var ae *api.Error
		if err == nil || errors.As(err, &ae) {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		// The connection is broken or the call hung: start afresh.
		c.Close()
		cl.c = nil
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// start sends exec.start for e (retrying with the same id, which is
// idempotent, when the connection breaks) and records the answer in e.
func (cl *client) start(ctx context.Context, e *Exec, params any) (api.Record, error) {
	var rec api.Record
	e.Sent = time.Now()
	cl.ph.add(e)
	err := cl.call(ctx, func(ctx context.Context, c *ipc.Client) error {
		return c.Call(ctx, "exec.start", params, &rec)
	})
	cl.ph.mu.Lock()
	defer cl.ph.mu.Unlock()
	var ae *api.Error
	switch {
	case err == nil:
		e.Acked = true
		e.AckedAt = time.Now()
		e.TimeoutMS = rec.TimeoutMS
	case errors.As(err, &ae):
		e.Refused = ae.Code
		e.RefusedMsg = ae.Message
	default:
		e.Uncertain = true
	}
	return rec, err
}

// wait waits until e is cleaned and notes when the client saw that.
func (cl *client) wait(ctx context.Context, e *Exec) (api.Record, error) {
	var rec api.Record
	err := cl.call(ctx, func(ctx context.Context, c *ipc.Client) error {
		var err error
		rec, err = c.Wait(ctx, api.WaitParams{ID: e.ID})
		if err == nil && rec.State != api.StateCleaned {
			return fmt.Errorf("exec.wait %s returned state %v", e.ID, rec.State)
		}
		return err
	})
	if err == nil {
		cl.ph.mu.Lock()
		e.SeenFinal = time.Now()
		cl.ph.mu.Unlock()
	}
	return rec, err
}

func (cl *client) labels() map[string]string {
	return map[string]string{"drill_run": cl.cfg.Run, "drill_phase": cl.ph.Name, "drill_client": strconv.Itoa(cl.n)}
}

func (cl *client) base(id string, argv ...string) api.StartParams {
	return api.StartParams{ID: id, Argv: argv, Env: cl.cfg.Env(id), Cwd: "/", Labels: cl.labels(), TimeoutMS: 60000, GraceMS: 500}
}

func (cl *client) run(ctx context.Context, k Kind, id string) {
	e := &Exec{ID: id, Kind: k, Want: api.OutcomeExited, Limit: api.DefaultOutputLimitBytes, Client: cl.n}
	switch k {
	case KindQuick:
		p := cl.base(id, "sh", "-c", `echo "$0"`, id)
		if cl.rng.IntN(3) == 0 {
			// Through the shim (and its warm pool) on every backend: a
			// root caller's host-network command is exec'd directly
			// under cgroup and pgroup.
			p.Network = "none"
		}
		e.Stdout = []byte(id + "\n")
		t0 := time.Now()
		if _, err := cl.start(ctx, e, p); err != nil {
			return
		}
		if _, err := cl.wait(ctx, e); err == nil {
			cl.ph.sample(t0, time.Now())
		}
	case KindBig:
		n := []int{2000, 60000, 300000}[cl.rng.IntN(3)]
		p := cl.base(id, "seq", "1", strconv.Itoa(n))
		p.OutputLimitBytes = cl.cfg.OutputLimit
		e.Limit = cl.cfg.OutputLimit
		e.Stdout = Seq(n)
		if _, err := cl.start(ctx, e, p); err == nil {
			cl.wait(ctx, e)
		}
	case KindStdin:
		data := pattern(id, 1+cl.rng.IntN(96<<10))
		p := cl.base(id, "cat")
		p.StdinOpen = true
		e.Stdout = data
		if _, err := cl.start(ctx, e, p); err != nil {
			return
		}
		cl.feed(ctx, e, data)
		cl.wait(ctx, e)
	case KindTTY:
		p := map[string]any{
			"id": id, "argv": []string{"sh", "-c", "stty size; echo ttyok"}, "env": cl.cfg.Env(id), "cwd": "/",
			"labels": cl.labels(), "timeout_ms": 60000, "grace_ms": 500, "tty": true,
		}
		e.Contains = []string{"24 80", "ttyok"}
		if _, err := cl.start(ctx, e, p); err == nil {
			cl.wait(ctx, e)
		}
	case KindCancel:
		p := cl.base(id, "sh", "-c", "sleep 30 & sleep 30")
		e.Want = api.OutcomeCancelled
		e.Stdout = []byte{}
		if _, err := cl.start(ctx, e, p); err != nil {
			return
		}
		time.Sleep(time.Duration(cl.rng.IntN(300)) * time.Millisecond)
		err := cl.call(ctx, func(ctx context.Context, c *ipc.Client) error {
			_, err := c.Cancel(ctx, api.CancelParams{ID: id, Reason: "drill"})
			return err
		})
		if err != nil {
			e.problem("exec.cancel: %v", err)
		}
		cl.wait(ctx, e)
	case KindTimeout:
		p := cl.base(id, "sh", "-c", "sleep 30")
		p.TimeoutMS = int64(300 + cl.rng.IntN(500))
		p.GraceMS = 300
		e.Want = api.OutcomeTimeout
		e.Stdout = []byte{}
		if _, err := cl.start(ctx, e, p); err == nil {
			cl.wait(ctx, e)
		}
	case KindFollow:
		p := cl.base(id, "sh", "-c", `i=0; while [ $i -lt 40 ]; do echo "line-$i-$0"; i=$((i+1)); sleep 0.01; done`, id)
		var want bytes.Buffer
		for i := 0; i < 40; i++ {
			fmt.Fprintf(&want, "line-%d-%s\n", i, id)
		}
		e.Stdout = want.Bytes()
		if _, err := cl.start(ctx, e, p); err != nil {
			return
		}
		cl.followResume(ctx, e)
		cl.wait(ctx, e)
	case KindSlowFollow:
		n := 300000
		p := cl.base(id, "seq", "1", strconv.Itoa(n))
		p.OutputLimitBytes = cl.cfg.OutputLimit
		e.Limit = cl.cfg.OutputLimit
		e.Stdout = Seq(n)
		if _, err := cl.start(ctx, e, p); err != nil {
			return
		}
		// A follower that asks and never reads: the daemon must neither
		// block on it nor buffer for it without bound.
		nc, err := net.DialTimeout("unix", cl.cfg.Socket, 2*time.Second)
		if err == nil {
			fmt.Fprintf(nc, `{"jsonrpc":"2.0","id":1,"method":"exec.follow","params":{"id":%q}}`+"\n", id)
		}
		cl.wait(ctx, e)
		if nc != nil {
			nc.Close()
		}
	case KindVanish:
		// Send exec.start and exec.wait, close at once: whether the daemon
		// ran the start or not, it must end in one consistent way.
		e.Stdout = []byte("vanish-" + id + "\n")
		e.Uncertain = true
		e.Sent = time.Now()
		cl.ph.add(e)
		nc, err := net.DialTimeout("unix", cl.cfg.Socket, 2*time.Second)
		if err != nil {
			return
		}
		p := cl.base(id, "sh", "-c", `echo "vanish-$0"; sleep 0.1`, id)
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "exec.start", "params": p})
		w, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "exec.wait", "params": map[string]string{"id": id}})
		nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
		nc.Write(append(append(b, '\n'), append(w, '\n')...))
		nc.Close()
	}
}

// feed writes data to e's stdin in chunks and closes it. A write whose
// answer was lost (the connection broke) may or may not have reached the
// child, so e's output is then not checked byte for byte.
func (cl *client) feed(ctx context.Context, e *Exec, data []byte) {
	for off := 0; off < len(data); {
		n := min(len(data)-off, 16<<10)
		var res api.WriteResult
		c, err := cl.conn(ctx)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			res, err = c.Write(cctx, api.WriteParams{ID: e.ID, Data: data[off : off+n]})
			cancel()
		}
		if err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) {
				cl.ph.mu.Lock()
				e.OutputUncertain = true
				cl.ph.mu.Unlock()
				break
			}
			// A refusal (the execution was lost, say): nothing more to feed.
			cl.ph.mu.Lock()
			e.OutputUncertain = true
			cl.ph.mu.Unlock()
			return
		}
		off += res.Written
		if res.Written == 0 {
			e.problem("exec.write wrote 0 bytes")
			return
		}
	}
	err := cl.call(ctx, func(ctx context.Context, c *ipc.Client) error {
		_, err := c.Write(ctx, api.WriteParams{ID: e.ID, Close: true})
		return err
	})
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeInvalidParams {
			return // already finished (lost): the checker judges the outcome
		}
		e.problem("close stdin: %v", err)
	}
}

// followResume follows e on a connection of its own until it has seen some
// output, drops that connection, and follows again from the offset it had
// reached; what it assembled must equal what the child wrote (chunks a slow
// reader missed are read back with exec.output, as the protocol says).
func (cl *client) followResume(ctx context.Context, e *Exec) {
	got := make(map[int64][]byte)
	var mu sync.Mutex
	next := int64(0) // contiguous bytes received
	add := func(params json.RawMessage) {
		var n api.OutputNotification
		if json.Unmarshal(params, &n) != nil || n.Stream != "stdout" {
			return
		}
		mu.Lock()
		got[n.Offset] = n.Data
		for {
			d, ok := got[next]
			if !ok || len(d) == 0 {
				break
			}
			next += int64(len(d))
		}
		mu.Unlock()
	}
	contiguous := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return next
	}
	// First follower: drop it after the first 100 bytes (or 2s).
	if c1, err := ipc.DialContext(ctx, cl.cfg.Socket); err == nil {
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		enough := make(chan struct{})
		var once sync.Once
		go func() {
			c1.Follow(fctx, api.FollowParams{ID: e.ID}, func(method string, params json.RawMessage) {
				if method == api.NotifyOutput {
					add(params)
					if contiguous() >= 100 {
						once.Do(func() { close(enough) })
					}
				}
			})
			once.Do(func() { close(enough) })
		}()
		select {
		case <-enough:
		case <-time.After(2 * time.Second):
		}
		c1.Close()
		cancel()
	}
	// Resume from the offset reached, on a new connection, to the end.
	off := contiguous()
	err := cl.call(ctx, func(ctx context.Context, c *ipc.Client) error {
		c2, err := ipc.DialContext(ctx, cl.cfg.Socket)
		if err != nil {
			return err
		}
		defer c2.Close()
		_, err = c2.Follow(ctx, api.FollowParams{ID: e.ID, StdoutOffset: off}, func(method string, params json.RawMessage) {
			if method == api.NotifyOutput {
				add(params)
			}
		})
		return err
	})
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			e.problem("resumed follow: %v", err)
		}
		return
	}
	// Fill whatever a follower missed from the kept output.
	for {
		at := contiguous()
		if at >= int64(len(e.Stdout)) {
			break
		}
		var out api.OutputResult
		err := cl.call(ctx, func(ctx context.Context, c *ipc.Client) error {
			var err error
			out, err = c.Output(ctx, api.OutputParams{ID: e.ID, Offset: at})
			return err
		})
		if err != nil || len(out.Data) == 0 || out.Gap {
			break
		}
		add(mustJSON(api.OutputNotification{ID: e.ID, Stream: "stdout", Offset: out.Offset, Data: out.Data}))
	}
	mu.Lock()
	var asm []byte
	for at := int64(0); ; {
		d, ok := got[at]
		if !ok || len(d) == 0 {
			break
		}
		asm = append(asm, d...)
		at += int64(len(d))
	}
	mu.Unlock()
	cl.ph.mu.Lock()
	e.Followed = asm
	cl.ph.mu.Unlock()
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Seq is what `seq 1 n` writes.
func Seq(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// pattern is n bytes derived from seed (printable, so a mismatch reads well
// in a report).
func pattern(seed string, n int) []byte {
	out := make([]byte, 0, n+32)
	h := sha256.Sum256([]byte(seed))
	for len(out) < n {
		h = sha256.Sum256(h[:])
		out = fmt.Appendf(out, "%x", h[:16])
	}
	return out[:n]
}

// Probe asks the daemon what the mix may use: whether tty: true gives a
// terminal (a daemon that does not know the field runs the command on
// pipes, where `tty` says "not a tty").
func Probe(ctx context.Context, socket string) (tty bool, err error) {
	c, err := ipc.DialContext(ctx, socket)
	if err != nil {
		return false, err
	}
	defer c.Close()
	var rec api.Record
	err = c.Call(ctx, "exec.start", map[string]any{"argv": []string{"tty"}, "cwd": "/", "tty": true}, &rec)
	if err != nil {
		return false, fmt.Errorf("probe tty: %w", err)
	}
	if rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID}); err != nil {
		return false, fmt.Errorf("probe tty: %w", err)
	}
	out, err := c.Output(ctx, api.OutputParams{ID: rec.ID})
	if err != nil {
		return false, fmt.Errorf("probe tty: %w", err)
	}
	return strings.HasPrefix(string(out.Data), "/dev/"), nil
}
