// Package api holds corral's wire types: the execution record, the params and
// results of every JSON-RPC method, and the error codes of the protocol
// (docs/protocol.md), and the lifecycle's transition table (state.go:
// State.CanMoveTo, the one copy the reactor and the store use). It has no
// behaviour beyond that, validation and JSON shapes, so the daemon, the Go
// client and corralctl all agree on one definition.
package api

import (
	"errors"
	"fmt"
	"time"
)

// Outcome is the stable machine-readable result of an execution, set once
// when it reaches exited.
type Outcome string

const (
	OutcomeExited      Outcome = "exited"       // main process exited by itself
	OutcomeSignaled    Outcome = "signaled"     // main process died from a signal not sent by corral's escalation
	OutcomeTimeout     Outcome = "timeout"      // wall-clock timeout_ms passed
	OutcomeCancelled   Outcome = "cancelled"    // exec.cancel
	OutcomeMemoryLimit Outcome = "memory_limit" // the tree was OOM-killed
	OutcomeCPULimit    Outcome = "cpu_limit"    // cpu_ms of the whole tree used up
	OutcomeStartFailed Outcome = "start_failed" // the command could not be executed
	OutcomeLost        Outcome = "lost"         // the daemon restarted while it ran
	OutcomeIdleTimeout Outcome = "idle_timeout" // no output on either stream for idle_timeout_ms
)

// Outcomes lists every outcome above, for code that enumerates them (the
// metrics' outcome label): a new outcome is added here with its constant.
var Outcomes = []Outcome{
	OutcomeExited, OutcomeSignaled, OutcomeTimeout, OutcomeCancelled, OutcomeMemoryLimit,
	OutcomeCPULimit, OutcomeStartFailed, OutcomeLost, OutcomeIdleTimeout,
}

// Owner is the peer that started an execution, from SO_PEERCRED.
type Owner struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	PID int32  `json:"pid"`

	// Netns is the peer's network namespace, resolved once when corrald
	// accepted its connection (ipc); nil for an Owner that did not come
	// from an accept (a record's, an in-process caller's). It is never
	// encoded, and the reactor does not keep it in an execution or its
	// record: records and their comparisons are as without it. A pointer,
	// so that Owner stays comparable with == whatever error it holds.
	Netns *NetNS `json:"-"`
}

// NetNS is a peer's network namespace as resolved at accept: the
// namespace's inode number (the N of /proc/<pid>/ns/net's "net:[N]"), or
// why it could not be established.
type NetNS struct {
	Ino uint64 // 0 when Err is set
	Err error  // why the namespace is unknown; nil when Ino is set
}

// Usage is resource usage of an execution. CPU times are of the whole tree
// when a cgroup is available, otherwise of the main process and the children
// it waited for.
type Usage struct {
	CPUUserMS       int64 `json:"cpu_user_ms"`
	CPUSystemMS     int64 `json:"cpu_system_ms"`
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	TasksPeak       int64 `json:"tasks_peak"`
}

// StreamInfo describes one output stream of an execution.
type StreamInfo struct {
	TotalBytes int64 `json:"total_bytes"`
	KeptBytes  int64 `json:"kept_bytes"`
	Truncated  bool  `json:"truncated"`
}

// Record is an execution as every exec.* method returns it.
type Record struct {
	ID         string            `json:"id"`
	Owner      Owner             `json:"owner"`
	Argv       []string          `json:"argv"`
	Labels     map[string]string `json:"labels,omitempty"`
	State      State             `json:"state"`
	Outcome    *Outcome          `json:"outcome"`
	ExitCode   *int              `json:"exit_code"`
	Signal     *string           `json:"signal"`
	Error      *string           `json:"error"`
	PID        int               `json:"pid,omitempty"`
	Scope      string            `json:"scope,omitempty"`
	Workspace  *string           `json:"workspace"`
	CreatedAt  time.Time         `json:"created_at"`
	StartedAt  *time.Time        `json:"started_at,omitempty"`
	ExitedAt   *time.Time        `json:"exited_at,omitempty"`
	CleanedAt  *time.Time        `json:"cleaned_at,omitempty"`
	DurationMS int64             `json:"duration_ms"`
	Usage      Usage             `json:"usage"`
	Stdout     StreamInfo        `json:"stdout"`
	Stderr     StreamInfo        `json:"stderr"`

	// Extensions beyond protocol v1.
	User          string `json:"user,omitempty"`           // run-as user name when not the caller
	Network       string `json:"network,omitempty"`        // "host" or "none"
	Backend       string `json:"backend,omitempty"`        // scope backend that held the tree
	TimeoutMS     int64  `json:"timeout_ms,omitempty"`     // effective wall limit
	CancelReason  string `json:"cancel_reason,omitempty"`  // reason given to exec.cancel
	LeftoverTasks int    `json:"leftover_tasks,omitempty"` // processes that survived SIGKILL (D state)
	// CancelOutcome, while canceling, is the outcome corral decided to end
	// the execution with (cancelled, timeout, idle_timeout, cpu_limit,
	// memory_limit): stored with the canceling record, so a corrald
	// restarted after a crash ends it with that outcome. Cleared at exited,
	// where outcome says it.
	CancelOutcome Outcome `json:"cancel_outcome,omitempty"`
	// StartErrno names the errno of a start_failed execution ("ENOENT",
	// "EACCES", ...), so clients can tell "not found" (exit 127) from "cannot
	// execute" (126) without parsing Error.
	StartErrno string `json:"start_errno,omitempty"`
	// Unenforced names the limits asked for that this host's scope backend
	// cannot apply ("memory_bytes", "tasks_max", "cpu_ms"), so a client is
	// never misled into thinking they hold.
	Unenforced []string `json:"unenforced,omitempty"`

	// Protocol v1.1: terminals, idle timeouts, movable deadlines.
	TTY           bool     `json:"tty,omitempty"`             // the command runs on a pseudo-terminal
	TTYSize       *TTYSize `json:"tty_size,omitempty"`        // its current window size
	IdleTimeoutMS int64    `json:"idle_timeout_ms,omitempty"` // idle limit (no output on either stream)
	// Deadline is when the wall-clock limit ends the execution, while one
	// applies (from running until exited). exec.update moves it.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Adopted counts how many times a restarted or upgraded corrald took
	// the running execution over (handover, or the fd store after a
	// crash).
	Adopted int `json:"adopted,omitempty"`
}

// TTYSize is a terminal's window size in character cells.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Terminal sizes: the default of exec.start's tty_size, and the largest
// accepted (the kernel keeps both in 16 bits).
const (
	DefaultTTYRows = 24
	DefaultTTYCols = 80
	MaxTTYDim      = 10000
)

// StartParams are the params of exec.start. Zero values mean the default.
type StartParams struct {
	Argv             []string          `json:"argv"`
	Env              map[string]string `json:"env,omitempty"`
	Cwd              string            `json:"cwd,omitempty"`
	Stdin            []byte            `json:"stdin,omitempty"` // base64 on the wire ("data" encoding)
	StdinOpen        bool              `json:"stdin_open,omitempty"`
	TimeoutMS        int64             `json:"timeout_ms,omitempty"`
	GraceMS          int64             `json:"grace_ms,omitempty"`
	CPUMS            int64             `json:"cpu_ms,omitempty"`
	MemoryBytes      int64             `json:"memory_bytes,omitempty"`
	TasksMax         int64             `json:"tasks_max,omitempty"`
	OutputLimitBytes int64             `json:"output_limit_bytes,omitempty"`
	Labels           map[string]string `json:"labels,omitempty"`
	ID               string            `json:"id,omitempty"`
	User             string            `json:"user,omitempty"`
	Network          string            `json:"network,omitempty"`
	Redact           bool              `json:"redact,omitempty"`
	// Protocol v1.1.
	TTY           bool     `json:"tty,omitempty"`             // run on a new pseudo-terminal
	TTYSize       *TTYSize `json:"tty_size,omitempty"`        // its initial size (default 24x80)
	IdleTimeoutMS int64    `json:"idle_timeout_ms,omitempty"` // end it after this long without output (0: none)
	// Traceparent is the caller's W3C Trace Context: the execution's trace
	// becomes a child of that span.
	Traceparent string `json:"traceparent,omitempty"`
}

// Defaults of exec.start, as in the protocol.
const (
	DefaultTimeoutMS        = 30000
	DefaultGraceMS          = 2000
	DefaultTasksMax         = 256
	DefaultOutputLimitBytes = 262144
	MaxLineBytes            = 1 << 20
)

// Defaults is what daemon.info reports as the exec.start defaults.
type Defaults struct {
	TimeoutMS        int64 `json:"timeout_ms"`
	GraceMS          int64 `json:"grace_ms"`
	TasksMax         int64 `json:"tasks_max"`
	OutputLimitBytes int64 `json:"output_limit_bytes"`
}

// IDParams are the params of exec.get.
type IDParams struct {
	ID string `json:"id"`
}

// WaitParams are the params of exec.wait.
type WaitParams struct {
	ID        string `json:"id"`
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
}

// CancelParams are the params of exec.cancel.
type CancelParams struct {
	ID     string `json:"id"`
	Reason string `json:"reason,omitempty"`
}

// SignalParams are the params of exec.signal.
type SignalParams struct {
	ID     string `json:"id"`
	Signal string `json:"signal"`
	Target string `json:"target,omitempty"` // "all" (default) or "main"
}

// WriteParams are the params of exec.write.
type WriteParams struct {
	ID    string `json:"id"`
	Data  []byte `json:"data,omitempty"`
	Close bool   `json:"close,omitempty"`
}

// WriteResult is the result of exec.write.
type WriteResult struct {
	Written int `json:"written"`
}

// ListParams are the params of exec.list.
type ListParams struct {
	State  string            `json:"state,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Limit  int               `json:"limit,omitempty"`
}

// ListResult is the result of exec.list.
type ListResult struct {
	Executions []Record `json:"executions"`
}

// OutputParams are the params of exec.output.
type OutputParams struct {
	ID     string `json:"id"`
	Stream string `json:"stream,omitempty"` // "stdout" (default) or "stderr"
	Offset int64  `json:"offset,omitempty"`
	Limit  int64  `json:"limit,omitempty"`
	// WaitMS parks the call (at most MaxWaitMS) while nothing past Offset
	// is kept and the stream is open: it answers when data arrives, the
	// stream ends, or WaitMS passes (then Data is empty).
	WaitMS int64 `json:"wait_ms,omitempty"`
}

// MaxWaitMS is the longest exec.output wait_ms.
const MaxWaitMS = 60000

// UpdateParams are the params of exec.update.
type UpdateParams struct {
	ID string `json:"id"`
	// TimeoutMS is the new wall-clock limit, counted from now (longer or
	// shorter than the old one). Required.
	TimeoutMS *int64 `json:"timeout_ms"`
}

// ResizeParams are the params of exec.resize.
type ResizeParams struct {
	ID   string `json:"id"`
	Rows int    `json:"rows"`
	Cols int    `json:"cols"`
}

// OutputResult is the result of exec.output. Offsets count bytes of the whole
// stream as the child wrote it. When Offset was in the dropped middle of a
// truncated stream, Gap is true and Data starts at the first kept byte after
// it (Offset in the result says where).
type OutputResult struct {
	Data       []byte `json:"data"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	EOF        bool   `json:"eof"`
	Gap        bool   `json:"gap"`
}

// FollowParams are the params of exec.follow.
type FollowParams struct {
	ID           string `json:"id"`
	StdoutOffset int64  `json:"stdout_offset,omitempty"`
	StderrOffset int64  `json:"stderr_offset,omitempty"`
	HeartbeatMS  int64  `json:"heartbeat_ms,omitempty"`
}

// Notification methods sent during exec.follow.
const (
	NotifyOutput    = "exec.output"
	NotifyState     = "exec.state"
	NotifyHeartbeat = "exec.heartbeat"
)

// OutputNotification is the params of an exec.output notification.
type OutputNotification struct {
	ID     string `json:"id"`
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
}

// StateNotification is the params of an exec.state notification.
type StateNotification struct {
	Record Record `json:"record"`
}

// HeartbeatNotification is the params of an exec.heartbeat notification.
type HeartbeatNotification struct {
	ID    string `json:"id"`
	Usage Usage  `json:"usage"`
}

// Info is the result of daemon.info.
type Info struct {
	Version string   `json:"version"`
	PID     int      `json:"pid"`
	Backend string   `json:"backend"`
	Pidfd   bool     `json:"pidfd"`
	Cgroup  string   `json:"cgroup"`
	Kernel  string   `json:"kernel"`
	Default Defaults `json:"defaults"`
	Running int      `json:"running"`
	Total   int64    `json:"total"`

	// Extensions.
	Socket   string            `json:"socket,omitempty"`
	StateDir string            `json:"state_dir,omitempty"`
	Store    string            `json:"store,omitempty"` // "ok", "degraded: ...", "memory"
	Checks   map[string]string `json:"checks,omitempty"`
	Pool     *PoolInfo         `json:"pool,omitempty"`
	// Survival is what of the running executions survives a restart of
	// corrald on this host; Adopted how many this process took over at its
	// start; StartedAt when this process (image) started.
	Survival  *SurvivalInfo `json:"survival,omitempty"`
	Adopted   int           `json:"adopted"`
	StartedAt time.Time     `json:"started_at"`
}

// SurvivalInfo says what survives a restart of corrald (docs/corrald.md,
// "Restarts and upgrades").
type SurvivalInfo struct {
	// Handover: a reload (SIGHUP) execs the binary on disk in place and
	// hands every running execution over.
	Handover bool `json:"handover"`
	// FdStore: corrald runs under systemd with a file descriptor store, so
	// running executions survive a crash of corrald too.
	FdStore bool `json:"fdstore"`
	// PidfdExitInfo: the kernel keeps the exit status of a child reaped by
	// someone else while corrald was down (PIDFD_INFO_EXIT).
	PidfdExitInfo bool `json:"pidfd_exit_info"`
}

// PoolInfo describes the warm pool of shims waiting in their scopes.
type PoolInfo struct {
	Size    int     `json:"size"`     // target number of waiting shims now (--pool-size, raised by misses, at most 2 times it)
	Idle    int     `json:"idle"`     // waiting now
	Hits    int64   `json:"hits"`     // exec.start served by a waiting shim
	Misses  int64   `json:"misses"`   // exec.start that found the pool empty
	HitRate float64 `json:"hit_rate"` // hits / (hits + misses)
}

// Code is a JSON-RPC error code.
type Code int

const (
	CodeParseError     Code = -32700
	CodeInvalidRequest Code = -32600
	CodeMethodNotFound Code = -32601
	CodeInvalidParams  Code = -32602
	CodeInternal       Code = -32603
	CodeNotFound       Code = -32001
	CodePermission     Code = -32002
	CodeOverCapacity   Code = -32003
	CodeIdempotency    Code = -32004
	CodeShuttingDown   Code = -32005
)

// Error is an error with a JSON-RPC code; its Message is safe to show to the
// client. Internal detail stays in the wrapped error, which is logged only.
type Error struct {
	Code    Code
	Message string
	Err     error // internal cause, not sent
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %v", e.Message, e.Err)
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is a Sentinel with e's code, so that an error
// a client received (an *Error rebuilt from the wire) matches the sentinel
// the daemon returned: errors.Is(err, api.ErrNotFound).
func (e *Error) Is(target error) bool {
	s, ok := target.(*Sentinel)
	return ok && e.Code == s.code
}

// Errorf returns an *Error with code c and a formatted client-visible message.
func Errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...)}
}

// Sentinel is an immutable error with a JSON-RPC code, for the errors a
// caller matches with errors.Is (ErrNotFound). Its fields cannot be
// changed from outside the package, so no caller can alter what another
// sees. errors.As finds it as an *Error (a fresh copy), so ErrorCode and the
// server's error mapping need nothing special.
type Sentinel struct {
	code    Code
	message string
}

// NewSentinel returns a Sentinel with code c and client-visible message.
func NewSentinel(c Code, message string) *Sentinel { return &Sentinel{code: c, message: message} }

func (s *Sentinel) Error() string { return s.message }

// Code is the sentinel's JSON-RPC code.
func (s *Sentinel) Code() Code { return s.code }

// As lets errors.As(err, &target) with target an *Error see the sentinel.
func (s *Sentinel) As(target any) bool {
	if p, ok := target.(**Error); ok {
		*p = &Error{Code: s.code, Message: s.message}
		return true
	}
	return false
}

// ErrNotFound is returned for an id that does not exist or is not the
// caller's. Match it with errors.Is.
var ErrNotFound = NewSentinel(CodeNotFound, "execution not found")

// ErrorCode returns err's JSON-RPC code: the Code of an *Error in its chain,
// or CodeInternal.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
