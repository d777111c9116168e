package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// waitResult says why waitOutput returned.
type waitResult int

const (
	waitTimedOut waitResult = iota // d passed with no (more) output
	waitOutput                     // new output arrived (and, with settle, went quiet)
	waitEnded                      // the execution is cleaned: every byte is in
)

// waitForOutput blocks until execution id has output past offs, it ends,
// or d passes. With settle > 0 it does not return at the first new bytes but
// once no more have come for settle (or d passes): a REPL answers with an
// echo, then the result, then a prompt, and a caller wants all three.
//
// It waits with exec.follow on a connection of its own, so the daemon
// pushes the output and the end instead of being polled; closing that
// connection ends the follow in the daemon. The notifications only wake
// the wait: the caller reads the bytes with exec.output afterwards, since a
// slow follower may have notifications dropped.
func (s *mcpSession) waitForOutput(ctx context.Context, id string, offs readOffsets, d, settle time.Duration) (waitResult, error) {
	if d <= 0 {
		return waitTimedOut, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var c *ipc.Client
	err := s.call(ctx, func(*ipc.Client) error {
		var err error
		c, err = ipc.DialContext(ctx, s.socket)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return waitTimedOut, nil
		}
		return waitTimedOut, err
	}
	defer c.Close()

	woke := make(chan struct{}, 1)
	onNote := func(method string, params json.RawMessage) {
		if method != api.NotifyOutput {
			return
		}
		var n api.OutputNotification
		if json.Unmarshal(params, &n) != nil || len(n.Data) == 0 {
			return
		}
		from := offs.stdout
		if n.Stream == "stderr" {
			from = offs.stderr
		}
		if n.Offset+int64(len(n.Data)) > from {
			select {
			case woke <- struct{}{}:
			default:
			}
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Follow(ctx, api.FollowParams{ID: id, StdoutOffset: offs.stdout, StderrOffset: offs.stderr}, onNote)
		done <- err
	}()

	var quiet <-chan time.Time
	got := false
	for {
		select {
		case err := <-done:
			switch {
			case err == nil:
				return waitEnded, nil
			case ctx.Err() != nil:
				break
			default:
				return waitTimedOut, err
			}
			if got {
				return waitOutput, nil
			}
			return waitTimedOut, nil
		case <-woke:
			got = true
			if settle <= 0 {
				return waitOutput, nil
			}
			quiet = time.After(settle)
		case <-quiet:
			return waitOutput, nil
		}
	}
}
