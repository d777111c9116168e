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

// The handlers of the five tools; their inputs, outputs and bounds are
// in mcp_types.go.

func boolPtr(b bool) *bool { return &b }

// stateNames are the lifecycle's states in order (api.State), for
// list_executions' state enum.
func stateNames() []any {
	var names []any
	for s := api.StateStarted; s.Valid(); s++ {
		names = append(names, s.String())
	}
	return names
}

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
		InputSchema: schemaFor[listIn](nil, map[string][]any{"state": stateNames()}),
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
