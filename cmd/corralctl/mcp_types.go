package main

import "time"

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
