package drill

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/reactor"
)

// Exec is one execution the drill asked for, and what it expects of it.
// Its fields are guarded by the Phase's mutex once it has been added.
type Exec struct {
	ID     string
	Kind   Kind
	Client int
	Sent   time.Time // exec.start first sent
	// Acked: an exec.start answered with a record. Refused: it answered a
	// JSON-RPC error (nothing may have started). Uncertain: no answer came
	// (the connection broke, or the client vanished on purpose), so the
	// execution may or may not exist.
	Acked      bool
	AckedAt    time.Time
	Refused    api.Code
	RefusedMsg string
	Uncertain  bool

	Want      api.Outcome
	TimeoutMS int64
	// Stdout is what the child writes (nil: not checked); Limit the
	// output_limit_bytes it ran with. Contains lists what a terminal's
	// output must contain instead (a terminal rewrites line ends).
	Stdout   []byte
	Limit    int64
	Contains []string
	// OutputUncertain: what reached the child is not known (an exec.write
	// whose answer was lost), so its output is not compared.
	OutputUncertain bool
	// Followed is what a follow that dropped and resumed assembled.
	Followed []byte
	// SeenFinal is when the client saw it cleaned (zero: never).
	SeenFinal time.Time
	// AllowLost: the fault may end this execution lost (set by the fault,
	// from what the daemon reports it survives).
	AllowLost bool
	// AllowNeverRan: the fault may end this execution start_failed with
	// reactor.StartFailedRestart (it was still starting when corrald was
	// killed, and its command was never let run).
	AllowNeverRan bool

	problems []string
	mu       *sync.Mutex
}

func (e *Exec) problem(format string, args ...any) {
	e.mu.Lock()
	e.problems = append(e.problems, fmt.Sprintf(format, args...))
	e.mu.Unlock()
}

// Phase is one fault's drill: the executions started during it and the
// exec latency samples, split at the fault.
type Phase struct {
	Name string

	mu      sync.Mutex
	execs   []*Exec
	samples []sample
	// FaultAt is when the fault was injected, ClearedAt when it was
	// removed (or, for a one-shot fault, when it had happened).
	FaultAt, ClearedAt time.Time
	// RecoverFrom is where recovery time counts from: ClearedAt unless a
	// one-shot fault (a kill) sets it to the moment it struck.
	RecoverFrom time.Time
}

type sample struct{ start, end time.Time }

// NewPhase starts the record of one fault's drill.
func NewPhase(name string) *Phase { return &Phase{Name: name} }

func (p *Phase) add(e *Exec) {
	p.mu.Lock()
	e.mu = &p.mu
	p.execs = append(p.execs, e)
	p.mu.Unlock()
}

// Add records an execution a fault started itself.
func (p *Phase) Add(e *Exec) { p.add(e) }

func (p *Phase) sample(start, end time.Time) {
	p.mu.Lock()
	p.samples = append(p.samples, sample{start, end})
	p.mu.Unlock()
}

// MarkFault notes that the fault is in place now.
func (p *Phase) MarkFault() {
	p.mu.Lock()
	p.FaultAt = time.Now()
	p.mu.Unlock()
}

// MarkCleared notes that the fault is over now.
func (p *Phase) MarkCleared() {
	p.mu.Lock()
	p.ClearedAt = time.Now()
	p.mu.Unlock()
}

// MarkRecoverFrom notes that recovery counts from now.
func (p *Phase) MarkRecoverFrom() {
	p.mu.Lock()
	p.RecoverFrom = time.Now()
	p.mu.Unlock()
}

// AllowLostUnfinished marks every execution not seen cleaned by now as
// allowed to end lost: the daemon was killed and reports that it does not
// survive that.
func (p *Phase) AllowLostUnfinished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, e := range p.execs {
		if e.SeenFinal.IsZero() || e.SeenFinal.After(now) {
			e.AllowLost = true
		}
	}
}

// AllowLostUnanswered marks every execution whose exec.start had not been
// answered by now as allowed to end start_failed with
// reactor.StartFailedRestart (still starting, its command never let run)
// or lost (the moment between a held child's release and the park of its
// fds, with the reason): the daemon was killed and reports that it
// survives that, which covers what it told a client it runs and any start
// whose command was let run and its fds parked.
func (p *Phase) AllowLostUnanswered() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, e := range p.execs {
		if !e.Acked || e.AckedAt.After(now) {
			e.AllowLost = true
			e.AllowNeverRan = true
		}
	}
}

// Execs returns the phase's executions (for a fault that looks at them).
func (p *Phase) Execs() []*Exec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Exec(nil), p.execs...)
}

// Checks are the host-specific checks of a drill: what "left behind" means
// depends on the backend.
type Checks struct {
	Socket string
	// Leftovers lists what is left once every execution is cleaned
	// (processes, scopes, cgroups, workspaces, fds), waiting up to a bound
	// for it to settle. Nil means none are checked.
	Leftovers func(ctx context.Context) []string
	// AllowRefused says whether a refused exec.start (code, message) is
	// what this fault may cause; a refusal it does not allow is a wrong
	// outcome.
	AllowRefused func(code api.Code, msg string) bool
	// AnswerWithin is the generous "still answers" bound on daemon.info.
	AnswerWithin time.Duration
	// Tolerate says whether a record whose outcome is not the expected
	// one is nonetheless what this fault may cause (counted in
	// Row.Tolerated, and said in the report's note).
	Tolerate func(rec api.Record) bool
}

// Check waits for every execution of the phase to end and compares what
// happened with what was expected; it returns the phase's row of the
// report. Call it after the load has stopped.
func (p *Phase) Check(ctx context.Context, ch Checks) Row {
	row := Row{Fault: p.Name}
	if ch.AnswerWithin == 0 {
		ch.AnswerWithin = 10 * time.Second
	}
	c, err := dialRetry(ctx, ch.Socket, 30*time.Second)
	if err != nil {
		row.Problems = append(row.Problems, fmt.Sprintf("daemon does not answer after the fault: %v", err))
		row.Wrong++
		return row
	}
	defer c.Close()
	t0 := time.Now()
	ictx, cancel := context.WithTimeout(ctx, ch.AnswerWithin)
	_, err = c.Info(ictx)
	cancel()
	row.InfoLatency = time.Since(t0)
	if err != nil {
		row.Problems = append(row.Problems, fmt.Sprintf("daemon.info did not answer within %v: %v", ch.AnswerWithin, err))
		row.Wrong++
	}

	execs := p.Execs()
	byID := make(map[string]*Exec, len(execs))
	clients := make(map[int]bool)
	for _, e := range execs {
		byID[e.ID] = e
		clients[e.Client] = true
		p.checkOne(ctx, c, e, ch, &row)
	}
	p.checkRecords(ctx, c, byID, clients, &row)

	if ch.Leftovers != nil {
		left := ch.Leftovers(ctx)
		row.Leftovers = len(left)
		for _, l := range left {
			row.Problems = append(row.Problems, "left behind: "+l)
		}
	}
	p.latency(&row)
	return row
}

func (p *Phase) checkOne(ctx context.Context, c *ipc.Client, e *Exec, ch Checks, row *Row) {
	p.mu.Lock()
	acked, uncertain, refused, refusedMsg := e.Acked, e.Uncertain, e.Refused, e.RefusedMsg
	problems := append([]string(nil), e.problems...)
	p.mu.Unlock()
	bad := func(format string, args ...any) {
		row.wrongID(e.ID)
		row.Problems = append(row.Problems, fmt.Sprintf("%s (%s): ", e.ID, e.Kind)+fmt.Sprintf(format, args...))
	}
	for _, pr := range problems {
		bad("%s", pr)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	rec, err := c.Wait(wctx, api.WaitParams{ID: e.ID})
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		// exec.wait hung: take the record as it is.
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rec, err = c.Get(gctx, e.ID)
		cancel()
		if err == nil && rec.State == api.StateCleaned {
			bad("exec.wait did not answer within 30s, though exec.get says cleaned")
		}
	}
	found := err == nil
	if err != nil && api.ErrorCode(err) != api.CodeNotFound {
		bad("exec.wait: %v", err)
		return
	}
	switch {
	case refused != 0 && !acked:
		row.Refused++
		if ch.AllowRefused == nil || !ch.AllowRefused(refused, refusedMsg) {
			bad("exec.start refused with %d %q", refused, refusedMsg)
		}
		if found {
			bad("refused exec.start (%d %q) left a record, state %v", refused, refusedMsg, rec.State)
		}
		return
	case !acked && uncertain && !found:
		return // never reached the daemon
	case !found:
		row.Started++
		row.LostRecords++
		bad("exec.start answered, but the record is gone")
		return
	}
	row.Started++
	if rec.State != api.StateCleaned {
		bad("not cleaned 30s after the drill: state %v, outcome %q, pid %d, stdout %d bytes", rec.State, outcomeOf(rec), rec.PID, rec.Stdout.TotalBytes)
		return
	}
	row.Finished++
	got := outcomeOf(rec)
	if got == api.OutcomeLost {
		row.LostOutcomes++
		if !e.AllowLost {
			row.UnexpectedLost++
			bad("outcome lost (%s), where the daemon reports it survives this fault", strOr(rec.Error))
		} else {
			if row.LostWhy == nil {
				row.LostWhy = map[string]int{}
			}
			row.LostWhy[strOr(rec.Error)]++
		}
		if strOr(rec.Error) == "" {
			bad("outcome lost without an error saying why")
		}
		return
	}
	if got == api.OutcomeStartFailed && got != e.Want && e.AllowNeverRan && strOr(rec.Error) == reactor.StartFailedRestart {
		row.NeverRan++
		return
	}
	if got != e.Want && ch.Tolerate != nil && ch.Tolerate(rec) {
		row.Tolerated++
		return
	}
	if got != e.Want {
		// What tells a wrong outcome's cause: the signal, whether a
		// restarted corrald took the execution over, how much it wrote.
		bad("outcome %s (error %q, exit %v, signal %q, adopted %d, pid %d, stdout %d bytes), want %s",
			got, strOr(rec.Error), intOr(rec.ExitCode), strOr(rec.Signal), rec.Adopted, rec.PID, rec.Stdout.TotalBytes, e.Want)
		return
	}
	if e.Want == api.OutcomeExited && (rec.ExitCode == nil || *rec.ExitCode != 0) {
		bad("exit code %v, want 0", intOr(rec.ExitCode))
	}
	if e.Want == api.OutcomeTimeout && e.TimeoutMS > 0 && rec.DurationMS < e.TimeoutMS-5 {
		bad("timed out after %dms, before its timeout_ms %d", rec.DurationMS, e.TimeoutMS)
	}
	// A wall-clock deadline would fire minutes late after a step back;
	// a minute covers grace, kill wait and a loaded host.
	if e.Want == api.OutcomeTimeout && e.TimeoutMS > 0 && rec.DurationMS > e.TimeoutMS+60000 {
		bad("timed out after %dms, a minute past its timeout_ms %d", rec.DurationMS, e.TimeoutMS)
	}
	if e.OutputUncertain {
		row.Unchecked++
		return
	}
	if e.Stdout == nil && e.Contains == nil {
		return
	}
	kept, total, err := readKept(ctx, c, e.ID)
	if err != nil {
		bad("read output: %v", err)
		return
	}
	if e.Contains != nil {
		for _, s := range e.Contains {
			if !bytes.Contains(kept, []byte(s)) {
				bad("terminal output %q lacks %q (total_bytes %d, error %q, %dms from exited to cleaned)",
					kept, s, total, strOr(rec.Error), msBetween(rec.ExitedAt, rec.CleanedAt))
			}
		}
		return
	}
	want := expectKept(e.Stdout, e.Limit)
	if total != int64(len(e.Stdout)) {
		row.LostBytes += abs(int64(len(e.Stdout)) - total)
		bad("stdout total_bytes %d, the child wrote %d", total, len(e.Stdout))
	}
	if !bytes.Equal(kept, want) {
		n := commonPrefix(kept, want)
		row.LostBytes += int64(len(want) - n)
		bad("kept stdout differs from what the child wrote at byte %d (kept %d bytes, want %d): got %q want %q",
			n, len(kept), len(want), snippet(kept, n), snippet(want, n))
	}
	if e.Followed != nil && !bytes.Equal(e.Followed, e.Stdout) {
		n := commonPrefix(e.Followed, e.Stdout)
		bad("follow, drop and resume assembled %d bytes, differing at %d from the %d the child wrote", len(e.Followed), n, len(e.Stdout))
	}
}

// checkRecords lists the phase's records per client: each execution must
// have exactly one, and there must be none the drill did not ask for.
func (p *Phase) checkRecords(ctx context.Context, c *ipc.Client, byID map[string]*Exec, clients map[int]bool, row *Row) {
	var ns []int
	for n := range clients {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	for _, n := range ns {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := c.List(lctx, api.ListParams{Labels: map[string]string{"drill_phase": p.Name, "drill_client": fmt.Sprint(n)}, Limit: 1000})
		cancel()
		if err != nil {
			row.Problems = append(row.Problems, fmt.Sprintf("exec.list of client %d: %v", n, err))
			row.Wrong++
			continue
		}
		seen := make(map[string]int)
		for _, r := range res.Executions {
			seen[r.ID]++
			if byID[r.ID] == nil && !strings.HasPrefix(r.ID, "drill-") {
				continue
			}
			if byID[r.ID] == nil {
				row.wrongID(r.ID)
				row.Problems = append(row.Problems, fmt.Sprintf("exec.list shows %s, which the drill never started", r.ID))
			}
		}
		for id, k := range seen {
			if k > 1 {
				row.wrongID(id)
				row.Problems = append(row.Problems, fmt.Sprintf("%s has %d records", id, k))
			}
		}
	}
}

// readKept reads an execution's whole kept stdout with exec.output: the
// head and the tail of a truncated stream, without the dropped middle.
func readKept(ctx context.Context, c *ipc.Client, id string) ([]byte, int64, error) {
	var kept []byte
	var off, total int64
	for i := 0; i < 10000; i++ {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := c.Output(octx, api.OutputParams{ID: id, Offset: off})
		cancel()
		if err != nil {
			return nil, 0, err
		}
		kept = append(kept, out.Data...)
		total = out.TotalBytes
		if out.EOF && out.NextOffset >= out.TotalBytes {
			return kept, total, nil
		}
		if out.NextOffset <= off {
			return kept, total, fmt.Errorf("exec.output at %d made no progress (next %d, total %d, eof %v)", off, out.NextOffset, out.TotalBytes, out.EOF)
		}
		off = out.NextOffset
	}
	return kept, total, errors.New("exec.output: too many reads")
}

// expectKept is what the daemon keeps of b with output_limit_bytes limit:
// all of it, or the first and the last half of the limit.
func expectKept(b []byte, limit int64) []byte {
	if int64(len(b)) <= limit {
		return b
	}
	head := limit / 2
	tail := limit - head
	return append(append([]byte(nil), b[:head]...), b[int64(len(b))-tail:]...)
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func snippet(b []byte, at int) []byte {
	lo, hi := max(at-8, 0), min(at+24, len(b))
	if lo > hi {
		return nil
	}
	return b[lo:hi]
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

func outcomeOf(r api.Record) api.Outcome {
	if r.Outcome == nil {
		return ""
	}
	return *r.Outcome
}

// msBetween is b - a in milliseconds, -1 when either is unknown.
func msBetween(a, b *time.Time) int64 {
	if a == nil || b == nil {
		return -1
	}
	return b.Sub(*a).Milliseconds()
}

func strOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func intOr(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func dialRetry(ctx context.Context, socket string, within time.Duration) (*ipc.Client, error) {
	deadline := time.Now().Add(within)
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := ipc.DialContext(dctx, socket)
		if err == nil {
			_, err = c.Info(dctx)
			if err == nil {
				cancel()
				return c, nil
			}
			c.Close()
		}
		cancel()
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// DialRetry connects to the daemon at socket, retrying until it answers
// daemon.info or within passes.
func DialRetry(ctx context.Context, socket string, within time.Duration) (*ipc.Client, error) {
	return dialRetry(ctx, socket, within)
}

// wrongID counts one wrong result of execution id and names id among the
// row's wrong executions (once).
func (row *Row) wrongID(id string) {
	row.Wrong++
	if !slices.Contains(row.WrongIDs, id) {
		row.WrongIDs = append(row.WrongIDs, id)
	}
}
