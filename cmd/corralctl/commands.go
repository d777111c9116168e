package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/cmd/internal/cli"
	"github.com/corral-dev/corral/ipc"
)

// withClient dials the daemon, runs f and maps its error to exit status
// failCode.
func withClient(e *env, g *globalFlags, failCode int, f func(ctx context.Context, c *ipc.Client) (int, error)) int {
	ctx := context.Background()
	c, err := dial(ctx, e, g)
	if err != nil {
		return fail(e, failCode, "%v", err)
	}
	defer c.Close()
	code, err := f(ctx, c)
	if err != nil {
		return fail(e, failCode, "%s", describe(err))
	}
	return code
}

func cmdPs(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "ps")
	var labels kvFlag
	labels.what = "--label"
	state := choiceFlag{choices: []string{"started", "running", "canceling", "exited", "cleaned"}}
	fs.Var(&state, "state", "only executions in `STATE` (started, running, canceling, exited, cleaned)")
	fs.Var(&labels, "label", "only executions with label `KEY=VALUE` (repeatable; all must match)")
	limit := fs.Int("limit", 0, "at most `N` executions")
	cli.CompleteValues(fs, map[string]string{"state": "words:started running canceling exited cleaned"})
	if _, code, ok := parseArgs(e, fs, args, 0, exitUsage); !ok {
		return code
	}
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		res, err := c.List(ctx, api.ListParams{State: state.v, Labels: labels.m, Limit: *limit})
		if err != nil {
			return 0, fmt.Errorf("list executions: %w", err)
		}
		if g.json {
			return 0, printJSON(e.stdout, res)
		}
		return 0, writeTable(e.stdout, res.Executions, time.Now())
	})
}

func cmdStatus(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "status")
	pos, code, ok := parseArgs(e, fs, args, 1, exitUsage)
	if !ok {
		return code
	}
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		rec, err := c.Get(ctx, pos[0])
		if err != nil {
			return 0, fmt.Errorf("get %s: %w", pos[0], err)
		}
		if g.json {
			return 0, printJSON(e.stdout, rec)
		}
		return 0, writeRecord(e.stdout, rec, time.Now())
	})
}

func cmdLogs(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "logs")
	follow := fs.BoolP("follow", "f", false, "follow the output until the execution is cleaned")
	stderr := fs.Bool("stderr", false, "print stderr instead of stdout")
	pos, code, ok := parseArgs(e, fs, args, 1, exitUsage)
	if !ok {
		return code
	}
	id := pos[0]
	stream := "stdout"
	if *stderr {
		stream = "stderr"
	}
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		// Make sure the id exists (and is ours) before printing anything.
		if _, err := c.Get(ctx, id); err != nil {
			return 0, fmt.Errorf("get %s: %w", id, err)
		}
		var out io.Writer = e.stdout
		if g.json {
			out = &jsonChunks{w: e.stdout, stream: stream}
		}
		st := newStreamer(c, id, map[string]io.Writer{stream: out}, e.stderr)
		if !*follow {
			if err := st.fetch(ctx, stream, -1); err != nil {
				return 0, err
			}
			return 0, nil
		}
		rec, err := st.follow(ctx)
		rc := &reconnector{e: e, g: g, id: id}
		for err != nil && errors.Is(err, ipc.ErrClosed) && ctx.Err() == nil {
			// corrald reloading or restarting: follow on (as run does).
			nc, rerr := rc.redial(ctx, err, "following "+id+" on")
			if rerr != nil {
				return 0, fmt.Errorf("follow %s: %w; %w", id, err, rerr)
			}
			defer nc.Close()
			st.c = nc
			rec, err = st.follow(ctx)
		}
		if err != nil {
			return 0, fmt.Errorf("follow %s: %w", id, err)
		}
		if g.json {
			return 0, printJSON(e.stdout, rec)
		}
		return 0, nil
	})
}

// jsonChunks writes output as JSON lines {"stream":..., "data": base64}
// for logs --json.
type jsonChunks struct {
	w      io.Writer
	stream string
}

func (j *jsonChunks) Write(p []byte) (int, error) {
	b, err := json.Marshal(struct {
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	}{j.stream, p})
	if err != nil {
		return 0, fmt.Errorf("encode output: %w", err)
	}
	if _, err := j.w.Write(append(b, '\n')); err != nil {
		return 0, err
	}
	return len(p), nil
}

func cmdWait(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "wait")
	var timeout durationFlag
	fs.Var(&timeout, "timeout", "give up after `D` (e.g. 10s) and exit 124 if it has not finished")
	pos, code, ok := parseArgs(e, fs, args, 1, exitFailure)
	if !ok {
		return code
	}
	return withClient(e, g, exitFailure, func(ctx context.Context, c *ipc.Client) (int, error) {
		deadline := time.Now().Add(timeout.d)
		p := api.WaitParams{ID: pos[0]}
		rc := &reconnector{e: e, g: g, id: pos[0]}
		var rec api.Record
		for {
			if timeout.set {
				ms := max(0, millis(time.Until(deadline)))
				p.TimeoutMS = &ms
			}
			var err error
			rec, err = c.Wait(ctx, p)
			if err == nil {
				break
			}
			if !errors.Is(err, ipc.ErrClosed) {
				return 0, fmt.Errorf("wait %s: %w", pos[0], err)
			}
			// corrald reloading or restarting: the execution goes on,
			// so wait on over a new connection (as run does), within
			// --timeout.
			rctx, cancel := ctx, context.CancelFunc(func() {})
			if timeout.set {
				rctx, cancel = context.WithDeadline(ctx, deadline)
			}
			nc, rerr := rc.redial(rctx, err, "waiting for "+pos[0]+" on")
			cancel()
			if rerr != nil {
				if timeout.set && !time.Now().Before(deadline) {
					fmt.Fprintf(e.stderr, "corralctl: wait %s: %v; --timeout %s passed while corrald was out of reach\n", pos[0], err, formatDuration(timeout.d))
					return exitTimeout, nil
				}
				return 0, fmt.Errorf("wait %s: %w; %w", pos[0], err, rerr)
			}
			defer nc.Close()
			c = nc
		}
		if g.json {
			if err := printJSON(e.stdout, rec); err != nil {
				return 0, err
			}
		} else {
			fmt.Fprintln(e.stdout, summary(rec))
		}
		if rec.Outcome == nil {
			return exitTimeout, nil
		}
		code, _ := exitStatus(rec)
		return code, nil
	})
}

func cmdCancel(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "cancel")
	reason := fs.String("reason", "", "why, recorded in the execution (cancel_reason)")
	cli.VarNames(fs, map[string]string{"reason": "REASON"})
	pos, code, ok := parseArgs(e, fs, args, 1, exitUsage)
	if !ok {
		return code
	}
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		rec, err := c.Cancel(ctx, api.CancelParams{ID: pos[0], Reason: *reason})
		if err != nil {
			return 0, fmt.Errorf("cancel %s: %w", pos[0], err)
		}
		return 0, printRecordOrSummary(e, g, rec)
	})
}

func cmdSignal(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "signal")
	mainOnly := fs.Bool("main", false, "signal only the main process, not the whole tree")
	pos, code, ok := parseArgs(e, fs, killStyle(fs, args), 2, exitUsage)
	if !ok {
		return code
	}
	sig, known := signalName(pos[1])
	if !known {
		return fail(e, exitUsage, "unknown signal %q (want a name such as SIGINT or INT, or a number)", pos[1])
	}
	target := "all"
	if *mainOnly {
		target = "main"
	}
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		rec, err := c.Signal(ctx, api.SignalParams{ID: pos[0], Signal: sig, Target: target})
		if err != nil {
			return 0, fmt.Errorf("signal %s: %w", pos[0], err)
		}
		return 0, printRecordOrSummary(e, g, rec)
	})
}

func cmdExtend(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "extend")
	pos, code, ok := parseArgs(e, fs, args, 2, exitUsage)
	if !ok {
		return code
	}
	d, err := parseDuration(pos[1])
	if err != nil || d <= 0 {
		if err == nil {
			err = fmt.Errorf("invalid duration %q: must be positive", pos[1])
		}
		return fail(e, exitUsage, "%v", err)
	}
	ms := millis(d)
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		rec, err := c.Update(ctx, api.UpdateParams{ID: pos[0], TimeoutMS: &ms})
		if err != nil {
			return 0, fmt.Errorf("extend %s: %w", pos[0], err)
		}
		if g.json {
			return 0, printJSON(e.stdout, rec)
		}
		if rec.Deadline != nil {
			fmt.Fprintf(e.stdout, "%s: deadline %s (in %s)\n", rec.ID, rec.Deadline.Local().Format(time.RFC3339), formatDuration(time.Until(*rec.Deadline)))
			return 0, nil
		}
		return 0, printRecordOrSummary(e, g, rec)
	})
}

func cmdInfo(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "info")
	if _, code, ok := parseArgs(e, fs, args, 0, exitUsage); !ok {
		return code
	}
	return withClient(e, g, exitErrorGeneric, func(ctx context.Context, c *ipc.Client) (int, error) {
		info, err := c.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("daemon info: %w", err)
		}
		if g.json {
			return 0, printJSON(e.stdout, info)
		}
		return 0, writeInfo(e.stdout, info)
	})
}

func printRecordOrSummary(e *env, g *globalFlags, rec api.Record) error {
	if g.json {
		return printJSON(e.stdout, rec)
	}
	_, err := fmt.Fprintln(e.stdout, summary(rec))
	return err
}

// killStyle rewrites kill(1)-style signal arguments ("-9", "-TERM") to
// plain ones, so that they are not taken for flags of fs.
func killStyle(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if len(a) < 2 || a[0] != '-' || a[1] == '-' || fs.ShorthandLookup(a[1:2]) != nil && len(a) == 2 {
			continue
		}
		if _, ok := signalName(a[1:]); ok {
			out[i] = a[1:]
		}
	}
	return out
}
