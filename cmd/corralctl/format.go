package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/corral-dev/corral/api"
)

// writeTable prints executions as the ps table.
func writeTable(w io.Writer, recs []api.Record, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tOUTCOME\tPID\tAGE\tDURATION\tARGV")
	for _, r := range recs {
		pid := "-"
		if r.PID != 0 {
			pid = strconv.Itoa(r.PID)
		}
		dur := "-"
		if r.State.Finished() {
			dur = formatDuration(time.Duration(r.DurationMS) * time.Millisecond)
		} else if r.StartedAt != nil {
			dur = formatDuration(now.Sub(*r.StartedAt)) + "+"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.State, outcomeString(r), pid,
			formatDuration(now.Sub(r.CreatedAt)), dur, argvString(r.Argv, 60))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// outcomeString is the outcome with the exit code or signal that explains it.
func outcomeString(r api.Record) string {
	if r.Outcome == nil {
		return "-"
	}
	s := string(*r.Outcome)
	switch {
	case r.ExitCode != nil && *r.Outcome == api.OutcomeExited:
		s += fmt.Sprintf("(%d)", *r.ExitCode)
	case r.Signal != nil:
		s += "(" + *r.Signal + ")"
	}
	return s
}

// summary is one line about an execution, for wait, cancel and signal.
func summary(r api.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.ID, r.State)
	if r.Outcome != nil {
		fmt.Fprintf(&b, " %s", outcomeString(r))
	}
	if r.State.Finished() {
		fmt.Fprintf(&b, " after %s", formatDuration(time.Duration(r.DurationMS)*time.Millisecond))
	}
	if r.Error != nil && *r.Error != "" {
		fmt.Fprintf(&b, ": %s", *r.Error)
	}
	return b.String()
}

// writeRecord prints one execution for status.
func writeRecord(w io.Writer, r api.Record, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}
	line("ID", "%s", r.ID)
	line("Argv", "%s", argvString(r.Argv, 0))
	line("State", "%s", r.State)
	line("Outcome", "%s", outcomeString(r))
	if r.Error != nil && *r.Error != "" {
		line("Error", "%s", *r.Error)
	}
	if r.CancelReason != "" {
		line("Cancel reason", "%s", r.CancelReason)
	}
	line("Owner", "uid %d, gid %d, pid %d", r.Owner.UID, r.Owner.GID, r.Owner.PID)
	if r.User != "" {
		line("User", "%s", r.User)
	}
	if r.PID != 0 {
		line("PID", "%d", r.PID)
	}
	if r.Scope != "" {
		scope := r.Scope
		if r.Backend != "" {
			scope += " (" + r.Backend + ")"
		}
		line("Scope", "%s", scope)
	}
	if r.Workspace != nil {
		line("Workspace", "%s", *r.Workspace)
	}
	if len(r.Labels) > 0 {
		keys := make([]string, 0, len(r.Labels))
		for k := range r.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + r.Labels[k]
		}
		line("Labels", "%s", strings.Join(parts, ", "))
	}
	stamp := func(k string, t *time.Time) {
		if t != nil && !t.IsZero() {
			line(k, "%s (%s ago)", t.Local().Format(time.RFC3339), formatDuration(now.Sub(*t)))
		}
	}
	stamp("Created", &r.CreatedAt)
	stamp("Started", r.StartedAt)
	stamp("Exited", r.ExitedAt)
	stamp("Cleaned", r.CleanedAt)
	line("Duration", "%s", formatDuration(time.Duration(r.DurationMS)*time.Millisecond))
	line("CPU", "%s user, %s system", formatDuration(time.Duration(r.Usage.CPUUserMS)*time.Millisecond),
		formatDuration(time.Duration(r.Usage.CPUSystemMS)*time.Millisecond))
	line("Peak memory", "%s", formatSize(r.Usage.PeakMemoryBytes))
	line("Peak tasks", "%d", r.Usage.TasksPeak)
	for _, s := range []struct {
		name string
		info api.StreamInfo
	}{{"Stdout", r.Stdout}, {"Stderr", r.Stderr}} {
		v := formatSize(s.info.TotalBytes)
		if s.info.Truncated {
			v += fmt.Sprintf(" (kept %s, middle dropped)", formatSize(s.info.KeptBytes))
		}
		line(s.name, "%s", v)
	}
	if r.TTY {
		v := "yes"
		if r.TTYSize != nil {
			v = fmt.Sprintf("yes, %dx%d", r.TTYSize.Rows, r.TTYSize.Cols)
		}
		line("Terminal", "%s", v)
	}
	if r.TimeoutMS > 0 {
		line("Timeout", "%s", formatDuration(time.Duration(r.TimeoutMS)*time.Millisecond))
	}
	if r.IdleTimeoutMS > 0 {
		line("Idle timeout", "%s", formatDuration(time.Duration(r.IdleTimeoutMS)*time.Millisecond))
	}
	if r.Deadline != nil {
		line("Deadline", "%s (in %s)", r.Deadline.Local().Format(time.RFC3339), formatDuration(r.Deadline.Sub(now)))
	}
	if r.LeftoverTasks > 0 {
		line("Leftover tasks", "%d (survived SIGKILL)", r.LeftoverTasks)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write record: %w", err)
	}
	return nil
}

// writeInfo prints daemon.info.
func writeInfo(w io.Writer, in api.Info) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "Version:\t%s\n", in.Version)
	fmt.Fprintf(tw, "PID:\t%d\n", in.PID)
	fmt.Fprintf(tw, "Backend:\t%s\n", in.Backend)
	fmt.Fprintf(tw, "pidfd:\t%t\n", in.Pidfd)
	fmt.Fprintf(tw, "cgroup:\t%s\n", in.Cgroup)
	fmt.Fprintf(tw, "Kernel:\t%s\n", in.Kernel)
	if in.Socket != "" {
		fmt.Fprintf(tw, "Socket:\t%s\n", in.Socket)
	}
	if in.StateDir != "" {
		fmt.Fprintf(tw, "State dir:\t%s\n", in.StateDir)
	}
	if in.Store != "" {
		fmt.Fprintf(tw, "Store:\t%s\n", in.Store)
	}
	fmt.Fprintf(tw, "Running:\t%d\n", in.Running)
	fmt.Fprintf(tw, "Total:\t%d\n", in.Total)
	d := in.Default
	fmt.Fprintf(tw, "Defaults:\ttimeout %s, grace %s, tasks %d, output limit %s\n",
		formatDuration(time.Duration(d.TimeoutMS)*time.Millisecond), formatDuration(time.Duration(d.GraceMS)*time.Millisecond),
		d.TasksMax, formatSize(d.OutputLimitBytes))
	if !in.StartedAt.IsZero() {
		fmt.Fprintf(tw, "Started:\t%s (adopted %d running executions)\n", in.StartedAt.Local().Format(time.RFC3339), in.Adopted)
	}
	if sv := in.Survival; sv != nil {
		fmt.Fprintf(tw, "Survives a reload:\t%s\n", yesNo(sv.Handover, "yes (handover)", "no"))
		crash := "no: no fd store (not a systemd service with FileDescriptorStoreMax=); running executions end lost"
		switch {
		case sv.FdStore && sv.PidfdExitInfo:
			crash = "yes (fd store)"
		case sv.FdStore:
			crash = "yes (fd store), but one that exits while corrald is down ends lost (no PIDFD_INFO_EXIT)"
		}
		fmt.Fprintf(tw, "Survives a crash:\t%s\n", crash)
	}
	keys := make([]string, 0, len(in.Checks))
	for k := range in.Checks {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "Check %s:\t%s\n", k, in.Checks[k])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write info: %w", err)
	}
	return nil
}

// formatDuration rounds d for people: 1.234s, 2m3s, 3h4m.
func formatDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

// formatSize prints n bytes with a binary unit: 512B, 1.5KiB, 12.0MiB.
func formatSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= 1024
		if f < 1024 || u == "TiB" {
			return fmt.Sprintf("%.1f%s", f, u)
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// argvString renders argv for a shell reader, quoting words that need it,
// cut to max runes when max > 0.
func argvString(argv []string, max int) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		words[i] = shellQuote(a)
	}
	s := strings.Join(words, " ")
	if r := []rune(s); max > 0 && len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return s
}

func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./=:,+@%", c)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func yesNo(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}
