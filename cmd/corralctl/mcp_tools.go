package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// The five tools of `corralctl mcp` (docs/mcp.md). Their inputs and
// outputs are Go types; the SDK derives the JSON Schemas from them (the
// jsonschema tags are the descriptions), validates the arguments against
// them and returns the output as structuredContent. Each handler also
// writes a short text block for clients and models that read only text.

// Bounds of the tools' arguments.
const (
	defaultYieldMS      = 10000
	defaultStdinYieldMS = 1000
	maxYieldMS          = 600000
	maxWaitMS           = 60000 // as exec.output wait_ms
	defaultOutputBytes  = 16384
	minOutputBytes      = 64
	maxOutputBytes      = 1 << 20
	// maxArgBytes is the kernel's limit on one argument string
	// (MAX_ARG_STRLEN, 32 pages, with its terminating NUL).
	maxArgBytes = 32*4096 - 1
	// maxRequestBytes keeps exec.start within corrald's 1 MiB line limit
	// with room for the other fields and JSON escaping.
	maxRequestBytes = 512 << 10
	// writeSettle is how long write_stdin waits for more output once the
	// first new bytes arrived.
	writeSettle = 250 * time.Millisecond
	// cancelWait bounds how long cancel_execution waits for cleaned: grace
	// and corrald's kill wait fit, and an MCP client's request timeout
	// (often 60 s) is not reached.
	cancelWait = 30 * time.Second
)

// execCommandIn is exec_command's input.
type execCommandIn struct {
	Cmd            string            `json:"cmd,omitempty" jsonschema:"shell command line, run by /bin/sh -c (give cmd or argv; at most 131071 bytes)"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"program and arguments, run without a shell (instead of cmd)"`
	Workdir        string            `json:"workdir,omitempty" jsonschema:"working directory (absolute path); default: corrald's temporary workspace"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables of the command (corrald's own environment never leaks in)"`
	TimeoutMS      int64             `json:"timeout_ms,omitempty" jsonschema:"wall-clock limit in milliseconds, after which the whole process tree is stopped; default corrald's (30000)"`
	IdleTimeoutMS  int64             `json:"idle_timeout_ms,omitempty" jsonschema:"stop the command when it writes no output for this many milliseconds"`
	YieldTimeMS    int64             `json:"yield_time_ms" jsonschema:"how long to wait for the command to end before returning with running: true (then use read_output, write_stdin or cancel_execution)"`
	TTY            bool              `json:"tty,omitempty" jsonschema:"run on a pseudo-terminal (for REPLs and programs that want a terminal); stdin stays open for write_stdin"`
	StdinOpen      *bool             `json:"stdin_open,omitempty" jsonschema:"keep stdin open for write_stdin; default true with tty, false without (stdin is then empty)"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command's stdin first"`
	Network        string            `json:"network,omitempty" jsonschema:"host (default) or none (no network at all)"`
	MaxOutputBytes int64             `json:"max_output_bytes" jsonschema:"byte budget of stdout and stderr together in this result; beyond it the head and tail are kept and the middle is marked omitted"`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"labels to tag the execution with (list_executions filters by them)"`
	Redact         bool              `json:"redact" jsonschema:"replace bearer tokens, AWS keys and PEM private keys in the output with [REDACTED] before it is kept or shown (on unless set to false)"`
}

// writeStdinIn is write_stdin's input.
type writeStdinIn struct {
	ID             string `json:"id" jsonschema:"execution id (from exec_command)"`
	Chars          string `json:"chars,omitempty" jsonschema:"text to write to the command's stdin (a terminal for tty: true); include the newline; empty just polls for output"`
	Close          bool   `json:"close,omitempty" jsonschema:"close stdin after writing (end of input)"`
	YieldTimeMS    int64  `json:"yield_time_ms" jsonschema:"how long to wait for output after writing"`
	MaxOutputBytes int64  `json:"max_output_bytes" jsonschema:"byte budget of the output in this result"`
}

// readOutputIn is read_output's input.
type readOutputIn struct {
	ID             string `json:"id" jsonschema:"execution id"`
	StdoutOffset   *int64 `json:"stdout_offset,omitempty" jsonschema:"stdout byte offset to read from; default: where this session last read"`
	StderrOffset   *int64 `json:"stderr_offset,omitempty" jsonschema:"stderr byte offset to read from; default: where this session last read"`
	WaitMS         int64  `json:"wait_ms,omitempty" jsonschema:"when there is no new output yet, wait up to this many milliseconds (at most 60000) for some or for the end"`
	MaxOutputBytes int64  `json:"max_output_bytes" jsonschema:"byte budget of the output in this result"`
}

// listIn is list_executions' input.
type listIn struct {
	State  string            `json:"state,omitempty" jsonschema:"only executions in this state: started, running, canceling, exited or cleaned"`
	Labels map[string]string `json:"labels,omitempty" jsonschema:"only executions with all these labels"`
}

// cancelIn is cancel_execution's input.
type cancelIn struct {
	ID     string `json:"id" jsonschema:"execution id"`
	Reason string `json:"reason,omitempty" jsonschema:"why, recorded with the execution"`
}

// execStatus is the result of exec_command, write_stdin, read_output and
// cancel_execution.
type execStatus struct {
	ID               string  `json:"id" jsonschema:"execution id"`
	State            string  `json:"state" jsonschema:"started, running, canceling, exited or cleaned"`
	Outcome          *string `json:"outcome" jsonschema:"once ended: exited, signaled, timeout, idle_timeout, cancelled, memory_limit, cpu_limit, start_failed or lost"`
	ExitCode         *int    `json:"exit_code" jsonschema:"exit status when the command exited by itself"`
	Signal           *string `json:"signal" jsonschema:"signal that killed the main process"`
	Error            *string `json:"error,omitempty" jsonschema:"corrald's explanation, e.g. why the command could not start"`
	Running          bool    `json:"running" jsonschema:"true while the command has not ended"`
	Stdout           string  `json:"stdout" jsonschema:"stdout since the last read (terminal output for tty)"`
	Stderr           string  `json:"stderr" jsonschema:"stderr since the last read"`
	StdoutTotalBytes int64   `json:"stdout_total_bytes" jsonschema:"bytes the command has written to stdout so far"`
	StderrTotalBytes int64   `json:"stderr_total_bytes" jsonschema:"bytes the command has written to stderr so far"`
	StdoutNextOffset int64   `json:"stdout_next_offset" jsonschema:"stdout offset the next read starts at"`
	StderrNextOffset int64   `json:"stderr_next_offset" jsonschema:"stderr offset the next read starts at"`
	WallTimeMS       int64   `json:"wall_time_ms" jsonschema:"time since the command started (its duration once ended)"`
}

// listEntry is one execution in list_executions' result.
type listEntry struct {
	ID       string            `json:"id"`
	Argv     []string          `json:"argv"`
	State    string            `json:"state"`
	Outcome  *string           `json:"outcome"`
	ExitCode *int              `json:"exit_code"`
	Age      string            `json:"age" jsonschema:"time since it was created, e.g. 1m30s"`
	AgeMS    int64             `json:"age_ms"`
	Labels   map[string]string `json:"labels,omitempty"`
}

type listOut struct {
	Executions []listEntry `json:"executions"`
}

func boolPtr(b bool) *bool { return &b }

// registerTools adds the five tools to srv.
func (s *mcpSession) registerTools(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "exec_command",
		Title:       "Run a command",
		Description: "Run a command under corrald's supervision (its own process tree, limits and timeout; it keeps running if this client goes away) and wait up to yield_time_ms for it to end. Returns exit code, outcome and output (head and tail within max_output_bytes). If it is still running, continue with read_output, write_stdin or cancel_execution using the returned id.",
		InputSchema: schemaFor[execCommandIn](map[string]any{"yield_time_ms": defaultYieldMS, "max_output_bytes": defaultOutputBytes, "redact": true},
			map[string][]any{"network": {"host", "none"}}),
		Annotations: &mcp.ToolAnnotations{Title: "Run a command", DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(true)},
	}, s.execCommand)
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "write_stdin",
		Title:       "Write to a running command",
		Description: "Write chars to the stdin (or terminal) of a running execution started with tty or stdin_open, wait up to yield_time_ms for its answer, and return the output produced since this session last read it. Empty chars just polls.",
		InputSchema: schemaFor[writeStdinIn](map[string]any{"yield_time_ms": defaultStdinYieldMS, "max_output_bytes": defaultOutputBytes}, nil),
		Annotations: &mcp.ToolAnnotations{Title: "Write to a running command", DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(true)},
	}, s.writeStdin)
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "read_output",
		Title:       "Read a command's output",
		Description: "Return an execution's output past the given offsets (default: where this session last read) and its status; with wait_ms, wait for new output or the end first.",
		InputSchema: schemaFor[readOutputIn](map[string]any{"max_output_bytes": defaultOutputBytes}, nil),
		Annotations: &mcp.ToolAnnotations{Title: "Read a command's output", ReadOnlyHint: true, OpenWorldHint: boolPtr(false)},
	}, s.readOutput)
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "list_executions",
		Title:       "List executions",
		Description: "List your executions in corrald (running and recently ended), newest first, optionally filtered by state and labels.",
		InputSchema: schemaFor[listIn](nil, map[string][]any{"state": {"started", "running", "canceling", "exited", "cleaned"}}),
		Annotations: &mcp.ToolAnnotations{Title: "List executions", ReadOnlyHint: true, OpenWorldHint: boolPtr(false)},
	}, s.listExecutions)
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "cancel_execution",
		Title:       "Cancel a command",
		Description: "Stop an execution and its whole process tree (SIGTERM, then SIGKILL after its grace period) and return its final status once everything is gone. Cancelling an ended execution just returns its status.",
		InputSchema: schemaFor[cancelIn](nil, nil),
		Annotations: &mcp.ToolAnnotations{Title: "Cancel a command", DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.cancelExecution)
}

func (s *mcpSession) execCommand(ctx context.Context, _ *mcp.CallToolRequest, in execCommandIn) (*mcp.CallToolResult, execStatus, error) {
	argv, err := commandArgv(in)
	if err != nil {
		return nil, execStatus{}, err
	}
	if err := checkBudget(in.MaxOutputBytes); err != nil {
		return nil, execStatus{}, err
	}
	if err := checkMS("yield_time_ms", in.YieldTimeMS, maxYieldMS); err != nil {
		return nil, execStatus{}, err
	}
	if in.TimeoutMS < 0 || in.IdleTimeoutMS < 0 {
		return nil, execStatus{}, errors.New("timeout_ms and idle_timeout_ms must not be negative; leave them out for corrald's defaults")
	}
	if in.Network != "" && in.Network != "host" && in.Network != "none" {
		return nil, execStatus{}, fmt.Errorf("network is %q; give \"host\" or \"none\"", in.Network)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, execStatus{}, fmt.Errorf("exec_command: make an execution id: %w", err)
	}
	p := api.StartParams{
		Argv: argv, Env: in.Env, Cwd: in.Workdir, TimeoutMS: in.TimeoutMS,
		Labels: in.Labels, Network: in.Network, ID: id.String(),
		StdinOpen: in.TTY, Stdin: []byte(in.Stdin), TTY: in.TTY, IdleTimeoutMS: in.IdleTimeoutMS, Redact: in.Redact,
	}
	if in.StdinOpen != nil {
		p.StdinOpen = *in.StdinOpen
	}
	begin := time.Now()
	var rec api.Record
	// The id makes the start safe to retry over a new connection: a second
	// exec.start with it returns the first one's record.
	err = s.call(ctx, func(c *ipc.Client) error {
		var err error
		rec, err = c.Start(ctx, p)
		return err
	})
	if err != nil {
		return nil, execStatus{}, s.toolError("exec_command", "", err)
	}
	s.noteStarted(rec.ID)
	rec, err = s.waitCleaned(ctx, rec, time.Duration(in.YieldTimeMS)*time.Millisecond, begin)
	if err != nil {
		return nil, execStatus{}, s.toolError("exec_command: wait for "+rec.ID, rec.ID, err)
	}
	return s.statusResult(ctx, "exec_command", rec, s.offsetsOf(rec.ID), in.MaxOutputBytes)
}

// waitCleaned waits until rec's execution is cleaned or d has passed since
// begin, with exec.wait in the daemon, and returns the latest record.
func (s *mcpSession) waitCleaned(ctx context.Context, rec api.Record, d time.Duration, begin time.Time) (api.Record, error) {
	if rec.State.Terminal() {
		return rec, nil
	}
	deadline := begin.Add(d)
	err := s.call(ctx, func(c *ipc.Client) error {
		left := max(time.Until(deadline).Milliseconds(), 0)
		r, err := c.Wait(ctx, api.WaitParams{ID: rec.ID, TimeoutMS: &left})
		if err == nil {
			rec = r
		}
		return err
	})
	return rec, err
}

func (s *mcpSession) writeStdin(ctx context.Context, _ *mcp.CallToolRequest, in writeStdinIn) (*mcp.CallToolResult, execStatus, error) {
	if err := checkID(in.ID); err != nil {
		return nil, execStatus{}, err
	}
	if err := checkBudget(in.MaxOutputBytes); err != nil {
		return nil, execStatus{}, err
	}
	if err := checkMS("yield_time_ms", in.YieldTimeMS, maxYieldMS); err != nil {
		return nil, execStatus{}, err
	}
	if len(in.Chars) > maxRequestBytes {
		return nil, execStatus{}, fmt.Errorf("chars is %d bytes, over the %d-byte limit of one call; write it in smaller pieces", len(in.Chars), maxRequestBytes)
	}
	if in.Chars != "" || in.Close {
		// Not retried: a write that reached the daemon before the
		// connection broke would be typed twice.
		c, err := s.conn(ctx)
		if err == nil {
			_, err = c.Write(ctx, api.WriteParams{ID: in.ID, Data: []byte(in.Chars), Close: in.Close})
		}
		if err != nil {
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeInvalidParams {
				return nil, execStatus{}, fmt.Errorf("write_stdin: corrald refused the write: %s; only executions started with tty: true or stdin_open: true take input, and only until they end or stdin is closed", ae.Message)
			}
			return nil, execStatus{}, s.toolError("write_stdin", in.ID, err)
		}
	}
	if _, err := s.waitForOutput(ctx, in.ID, s.offsetsOf(in.ID), time.Duration(in.YieldTimeMS)*time.Millisecond, writeSettle); err != nil {
		return nil, execStatus{}, s.toolError("write_stdin: wait for output", in.ID, err)
	}
	rec, err := s.get(ctx, in.ID)
	if err != nil {
		return nil, execStatus{}, s.toolError("write_stdin", in.ID, err)
	}
	return s.statusResult(ctx, "write_stdin", rec, s.offsetsOf(in.ID), in.MaxOutputBytes)
}

func (s *mcpSession) readOutput(ctx context.Context, _ *mcp.CallToolRequest, in readOutputIn) (*mcp.CallToolResult, execStatus, error) {
	if err := checkID(in.ID); err != nil {
		return nil, execStatus{}, err
	}
	if err := checkBudget(in.MaxOutputBytes); err != nil {
		return nil, execStatus{}, err
	}
	if err := checkMS("wait_ms", in.WaitMS, maxWaitMS); err != nil {
		return nil, execStatus{}, err
	}
	offs := s.offsetsOf(in.ID)
	if in.StdoutOffset != nil {
		offs.stdout = *in.StdoutOffset
	}
	if in.StderrOffset != nil {
		offs.stderr = *in.StderrOffset
	}
	if offs.stdout < 0 || offs.stderr < 0 {
		return nil, execStatus{}, errors.New("stdout_offset and stderr_offset must not be negative; leave them out to read from where this session last read")
	}
	rec, err := s.get(ctx, in.ID)
	if err != nil {
		return nil, execStatus{}, s.toolError("read_output", in.ID, err)
	}
	if in.WaitMS > 0 && !rec.State.Terminal() && rec.Stdout.TotalBytes <= offs.stdout && rec.Stderr.TotalBytes <= offs.stderr {
		if _, err := s.waitForOutput(ctx, in.ID, offs, time.Duration(in.WaitMS)*time.Millisecond, 0); err != nil {
			return nil, execStatus{}, s.toolError("read_output: wait for output", in.ID, err)
		}
		if rec, err = s.get(ctx, in.ID); err != nil {
			return nil, execStatus{}, s.toolError("read_output", in.ID, err)
		}
	}
	return s.statusResult(ctx, "read_output", rec, offs, in.MaxOutputBytes)
}

func (s *mcpSession) listExecutions(ctx context.Context, _ *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, listOut, error) {
	var res api.ListResult
	err := s.call(ctx, func(c *ipc.Client) error {
		var err error
		res, err = c.List(ctx, api.ListParams{State: in.State, Labels: in.Labels})
		return err
	})
	if err != nil {
		return nil, listOut{}, s.toolError("list_executions", "", err)
	}
	now := time.Now()
	out := listOut{Executions: []listEntry{}}
	var b strings.Builder
	fmt.Fprintf(&b, "%d execution(s)\n", len(res.Executions))
	for _, r := range res.Executions {
		age := now.Sub(r.CreatedAt).Round(time.Second)
		e := listEntry{ID: r.ID, Argv: r.Argv, State: r.State.String(), ExitCode: r.ExitCode,
			Age: age.String(), AgeMS: now.Sub(r.CreatedAt).Milliseconds(), Labels: r.Labels}
		if r.Outcome != nil {
			o := string(*r.Outcome)
			e.Outcome = &o
		}
		out.Executions = append(out.Executions, e)
		fmt.Fprintf(&b, "%s  %-9s %-12s %6s ago  %s\n", r.ID, r.State, outcomeText(r), age, strings.Join(r.Argv, " "))
	}
	return textResult(b.String()), out, nil
}

func (s *mcpSession) cancelExecution(ctx context.Context, _ *mcp.CallToolRequest, in cancelIn) (*mcp.CallToolResult, execStatus, error) {
	if err := checkID(in.ID); err != nil {
		return nil, execStatus{}, err
	}
	var rec api.Record
	err := s.call(ctx, func(c *ipc.Client) error {
		var err error
		rec, err = c.Cancel(ctx, api.CancelParams{ID: in.ID, Reason: in.Reason})
		return err
	})
	if err != nil {
		return nil, execStatus{}, s.toolError("cancel_execution", in.ID, err)
	}
	if rec, err = s.waitCleaned(ctx, rec, cancelWait, time.Now()); err != nil {
		return nil, execStatus{}, s.toolError("cancel_execution: wait for "+in.ID, in.ID, err)
	}
	return s.statusResult(ctx, "cancel_execution", rec, s.offsetsOf(in.ID), defaultOutputBytes)
}

func (s *mcpSession) get(ctx context.Context, id string) (api.Record, error) {
	var rec api.Record
	err := s.call(ctx, func(c *ipc.Client) error {
		var err error
		rec, err = c.Get(ctx, id)
		return err
	})
	return rec, err
}

// statusResult reads rec's output past offs within budget bytes, moves the
// session's offsets past what it read, and returns the status fields with
// their text block.
func (s *mcpSession) statusResult(ctx context.Context, tool string, rec api.Record, offs readOffsets, budget int64) (*mcp.CallToolResult, execStatus, error) {
	st := execStatus{
		ID: rec.ID, State: rec.State.String(), ExitCode: rec.ExitCode, Signal: rec.Signal, Error: rec.Error,
		Running: !rec.State.Finished(), StdoutTotalBytes: rec.Stdout.TotalBytes, StderrTotalBytes: rec.Stderr.TotalBytes,
	}
	if rec.Outcome != nil {
		o := string(*rec.Outcome)
		st.Outcome = &o
	}
	switch {
	case rec.State.Finished():
		st.WallTimeMS = rec.DurationMS
	case rec.StartedAt != nil:
		st.WallTimeMS = time.Since(*rec.StartedAt).Milliseconds()
	default:
		st.WallTimeMS = time.Since(rec.CreatedAt).Milliseconds()
	}
	outB, errB := splitBudget(budget, rec.Stdout.TotalBytes-offs.stdout, rec.Stderr.TotalBytes-offs.stderr)
	var out, serr streamText
	err := s.call(ctx, func(c *ipc.Client) error {
		var err error
		if out, err = readBudgeted(ctx, c.Output, rec.ID, "stdout", offs.stdout, outB); err != nil {
			return err
		}
		serr, err = readBudgeted(ctx, c.Output, rec.ID, "stderr", offs.stderr, errB)
		return err
	})
	if err != nil {
		return nil, execStatus{}, s.toolError(tool+": read output of "+rec.ID, rec.ID, err)
	}
	s.advance(rec.ID, readOffsets{stdout: out.next, stderr: serr.next})
	st.Stdout, st.Stderr = out.text, serr.text
	st.StdoutTotalBytes, st.StderrTotalBytes = max(st.StdoutTotalBytes, out.total), max(st.StderrTotalBytes, serr.total)
	st.StdoutNextOffset, st.StderrNextOffset = out.next, serr.next
	return textResult(statusText(st)), st, nil
}

// splitBudget shares budget between two streams with outLeft and errLeft
// unread bytes: each gets what it needs when both fit; else stderr gets up
// to half and stdout the rest, and a stream that needs less leaves the
// remainder to the other.
func splitBudget(budget, outLeft, errLeft int64) (int64, int64) {
	outLeft, errLeft = max(outLeft, 0), max(errLeft, 0)
	if outLeft+errLeft <= budget {
		// Both fit; give any slack to both, as more may have arrived since.
		return max(budget-errLeft, minOutputBytes), max(budget-outLeft, minOutputBytes)
	}
	e := min(errLeft, budget/2)
	o := min(outLeft, budget-e)
	e = budget - o
	return max(o, minOutputBytes), max(e, minOutputBytes)
}

// statusText is the text block of a status result.
func statusText(st execStatus) string {
	var b strings.Builder
	switch {
	case st.Running:
		fmt.Fprintf(&b, "execution %s is still %s after %d ms. Continue with read_output (wait_ms), write_stdin or cancel_execution and id %q.\n", st.ID, st.State, st.WallTimeMS, st.ID)
	default:
		fmt.Fprintf(&b, "execution %s %s after %d ms", st.ID, endText(st), st.WallTimeMS)
		if st.Error != nil && *st.Error != "" {
			fmt.Fprintf(&b, ": %s", *st.Error)
		}
		b.WriteString("\n")
	}
	for _, s := range []struct {
		name, text  string
		total, next int64
	}{{"stdout", st.Stdout, st.StdoutTotalBytes, st.StdoutNextOffset}, {"stderr", st.Stderr, st.StderrTotalBytes, st.StderrNextOffset}} {
		if s.text == "" {
			continue
		}
		fmt.Fprintf(&b, "--- %s (to offset %d of %d) ---\n%s", s.name, s.next, s.total, s.text)
		if !strings.HasSuffix(s.text, "\n") {
			b.WriteString("\n")
		}
	}
	if st.Stdout == "" && st.Stderr == "" {
		b.WriteString("(no new output)\n")
	}
	return b.String()
}

// endText says how a finished execution ended.
func endText(st execStatus) string {
	o := ""
	if st.Outcome != nil {
		o = *st.Outcome
	}
	switch {
	case o == "exited" && st.ExitCode != nil:
		return fmt.Sprintf("exited with code %d", *st.ExitCode)
	case st.Signal != nil:
		return fmt.Sprintf("ended (%s, %s)", o, *st.Signal)
	case o != "":
		return "ended (" + o + ")"
	}
	return "is " + st.State
}

func outcomeText(r api.Record) string {
	switch {
	case r.Outcome == nil:
		return "-"
	case r.ExitCode != nil:
		return fmt.Sprintf("%s(%d)", *r.Outcome, *r.ExitCode)
	}
	return string(*r.Outcome)
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// commandArgv is the argv exec_command runs: /bin/sh -c cmd, or argv.
func commandArgv(in execCommandIn) ([]string, error) {
	switch {
	case in.Cmd != "" && len(in.Argv) > 0:
		return nil, errors.New("give either cmd (a shell command line) or argv (a program and its arguments), not both")
	case in.Cmd == "" && len(in.Argv) == 0:
		return nil, errors.New("missing command: give cmd (a shell command line, e.g. \"ls -l\") or argv (e.g. [\"ls\", \"-l\"])")
	}
	argv := in.Argv
	if in.Cmd != "" {
		argv = []string{"/bin/sh", "-c", in.Cmd}
	}
	total := 0
	for i, a := range argv {
		if len(a) > maxArgBytes {
			what := fmt.Sprintf("argv[%d]", i)
			if in.Cmd != "" {
				what = "cmd"
			}
			return nil, fmt.Errorf("%s is %d bytes; the kernel takes at most %d bytes in one argument. Write the script to a file in smaller pieces (exec_command with a heredoc, or write_stdin to cat > file) and run the file", what, len(a), maxArgBytes)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return nil, errors.New("the command contains a NUL byte, which no program argument can hold")
		}
		total += len(a)
	}
	for k, v := range in.Env {
		total += len(k) + len(v)
	}
	if total > maxRequestBytes {
		return nil, fmt.Errorf("the command and its environment are %d bytes, over the %d-byte limit of one call; put the data in a file and pass its name", total, maxRequestBytes)
	}
	return argv, nil
}

func checkID(id string) error {
	if strings.TrimSpace(id) == "" {
		return errors.New("missing id: give the id returned by exec_command (or one from list_executions)")
	}
	return nil
}

func checkBudget(n int64) error {
	if n < minOutputBytes || n > maxOutputBytes {
		return fmt.Errorf("max_output_bytes is %d; give a value from %d to %d (default %d)", n, minOutputBytes, maxOutputBytes, defaultOutputBytes)
	}
	return nil
}

func checkMS(name string, v, maxV int64) error {
	if v < 0 || v > maxV {
		return fmt.Errorf("%s is %d; give milliseconds from 0 to %d", name, v, maxV)
	}
	return nil
}
