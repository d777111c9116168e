package main

import (
	"strings"
	"testing"

	"github.com/corral-dev/corral/api"
)

func ptr[T any](v T) *T { return &v }

func TestExitStatus(t *testing.T) {
	rec := func(o api.Outcome, mod func(*api.Record)) api.Record {
		r := api.Record{ID: "x", Argv: []string{"cmd"}, State: api.StateCleaned, Outcome: &o}
		if mod != nil {
			mod(&r)
		}
		return r
	}
	tests := []struct {
		name    string
		rec     api.Record
		want    int
		wantMsg string // substring; "" means no message
	}{
		{"exit 0", rec(api.OutcomeExited, func(r *api.Record) { r.ExitCode = ptr(0) }), 0, ""},
		{"exit 3", rec(api.OutcomeExited, func(r *api.Record) { r.ExitCode = ptr(3) }), 3, ""},
		{"exited without code", rec(api.OutcomeExited, nil), 125, "without an exit code"},
		{"timeout", rec(api.OutcomeTimeout, func(r *api.Record) { r.Signal = ptr("SIGKILL") }), 124, "timed out"},
		{"signaled SIGKILL", rec(api.OutcomeSignaled, func(r *api.Record) { r.Signal = ptr("SIGKILL") }), 137, ""},
		{"signaled SIGSEGV", rec(api.OutcomeSignaled, func(r *api.Record) { r.Signal = ptr("SIGSEGV") }), 139, ""},
		{"cancelled SIGTERM", rec(api.OutcomeCancelled, func(r *api.Record) { r.Signal = ptr("SIGTERM") }), 143, "cancelled"},
		{"cancelled exited in grace", rec(api.OutcomeCancelled, func(r *api.Record) { r.ExitCode = ptr(0) }), 143, "cancelled"},
		{"cancelled exited 1 in grace", rec(api.OutcomeCancelled, func(r *api.Record) { r.ExitCode = ptr(1) }), 1, "cancelled"},
		{"memory limit", rec(api.OutcomeMemoryLimit, func(r *api.Record) { r.Signal = ptr("SIGKILL") }), 137, "memory"},
		{"cpu limit", rec(api.OutcomeCPULimit, func(r *api.Record) { r.Signal = ptr("SIGKILL") }), 137, "CPU"},
		{"cpu limit no signal", rec(api.OutcomeCPULimit, nil), 137, "CPU"},
		{"not found", rec(api.OutcomeStartFailed, func(r *api.Record) { r.StartErrno = "ENOENT"; r.Error = ptr("no such file") }), 127, "cannot run"},
		{"not executable", rec(api.OutcomeStartFailed, func(r *api.Record) { r.StartErrno = "EACCES"; r.Error = ptr("permission denied") }), 126, "permission denied"},
		{"bad cwd", rec(api.OutcomeStartFailed, func(r *api.Record) { r.StartErrno = "ENOTDIR" }), 126, "cannot run"},
		{"no errno, text says not found", rec(api.OutcomeStartFailed, func(r *api.Record) { r.Error = ptr("exec: No such file or directory") }), 127, "cannot run"},
		{"lost", rec(api.OutcomeLost, nil), 125, "lost"},
		{"unknown outcome", rec(api.Outcome("exploded"), nil), 125, "unknown outcome"},
		{"no outcome", api.Record{ID: "x", State: api.StateRunning}, 125, "no outcome"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := exitStatus(tt.rec)
			if got != tt.want {
				t.Errorf("exitStatus = %d, want %d", got, tt.want)
			}
			if tt.wantMsg == "" && msg != "" {
				t.Errorf("message = %q, want none", msg)
			}
			if !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", msg, tt.wantMsg)
			}
		})
	}
}

func TestSignalName(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"SIGINT", "SIGINT", true},
		{"int", "SIGINT", true},
		{"KILL", "SIGKILL", true},
		{"9", "SIGKILL", true},
		{"15", "SIGTERM", true},
		{"SIGNOPE", "", false},
		{"0", "", false},
		{"999", "", false},
	}
	for _, tt := range tests {
		got, ok := signalName(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("signalName(%q) = %q, %t; want %q, %t", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestArgvString(t *testing.T) {
	tests := []struct {
		argv []string
		max  int
		want string
	}{
		{[]string{"ls", "-l", "/tmp"}, 0, "ls -l /tmp"},
		{[]string{"sh", "-c", "echo 'hi' there"}, 0, `sh -c 'echo '\''hi'\'' there'`},
		{[]string{"echo", ""}, 0, "echo ''"},
		{[]string{"abcdefghij"}, 5, "abcd…"},
	}
	for _, tt := range tests {
		if got := argvString(tt.argv, tt.max); got != tt.want {
			t.Errorf("argvString(%q, %d) = %q, want %q", tt.argv, tt.max, got, tt.want)
		}
	}
}
