package ipc

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/corral-dev/corral/api"
)

// handler decodes params, calls the Service and returns the result to encode.
// It runs on the request's own goroutine.
type handler func(ctx context.Context, rc *reqContext, params json.RawMessage) (any, error)

// reqContext is what a handler knows about its caller.
type reqContext struct {
	svc    Service
	caller api.Owner
	// notify queues a daemon notification on the caller's connection without
	// blocking; false means it was dropped. Only exec.follow uses it.
	notify func(method string, params any) bool
	// park lets a handler answer later without holding its goroutine: it
	// returns the function to answer with (call it exactly once, from any
	// goroutine, without blocking), or nil when the connection has as many
	// parked calls as it may (the handler then answers itself). A handler
	// that parked returns errParked.
	park func() (reply func(result any, err error))
}

// errParked is what a handler returns when it parked the call (see
// reqContext.park): its answer comes through the reply function.
var errParked = errors.New("ipc: call parked")

// withParams adapts f to a handler: it decodes the params into a P
// (bytesField names the one base64 field, for the -32602 message; "" when
// there is none), then calls f. Every method goes through it.
func withParams[P any](bytesField string, f func(ctx context.Context, rc *reqContext, p P) (any, error)) handler {
	return func(ctx context.Context, rc *reqContext, raw json.RawMessage) (any, error) {
		var p P
		if err := decodeParams(raw, &p, bytesField); err != nil {
			return nil, err
		}
		return f(ctx, rc, p)
	}
}

// method adapts a Service method of the usual shape (the caller and one
// params value in, one result out) to a handler, by method expression:
// method("", Service.Get).
func method[P, R any](bytesField string, m func(Service, context.Context, api.Owner, P) (R, error)) handler {
	return withParams(bytesField, func(ctx context.Context, rc *reqContext, p P) (any, error) {
		return m(rc.svc, ctx, rc.caller, p)
	})
}

// methods is the method table. Every method answers an *api.Error's Code and
// Message when the Service returns one, and -32603 otherwise; params that do
// not decode answer -32602 naming the field.
var methods = map[string]handler{
	// exec.start (api.StartParams) -> api.Record. Starts argv as the caller;
	// a command that cannot be executed is a record with outcome
	// "start_failed", not an error. stdin is base64.
	// A Service that has the record encoded already (EncodedStarter) is
	// answered with those bytes.
	"exec.start": withParams("stdin", func(ctx context.Context, rc *reqContext, p api.StartParams) (any, error) {
		if s, ok := rc.svc.(EncodedStarter); ok {
			rec, js, err := s.StartEncoded(ctx, rc.caller, p)
			if err == nil && len(js) > 0 {
				return js, nil
			}
			return rec, err
		}
		return rc.svc.Start(ctx, rc.caller, p)
	}),
	// exec.get (api.IDParams) -> api.Record. -32001 when the id does not
	// exist or is not the caller's.
	"exec.get": method("", Service.Get),
	// exec.wait (api.WaitParams) -> api.Record once cleaned, or the current
	// record when timeout_ms passes first. Ends when the connection closes.
	// A Service that has the record encoded already (EncodedWaiter) is
	// answered with those bytes.
	"exec.wait": withParams("", func(ctx context.Context, rc *reqContext, p api.WaitParams) (any, error) {
		if w, ok := rc.svc.(EncodedWaiter); ok {
			rec, js, err := w.WaitEncoded(ctx, rc.caller, p)
			if err == nil && len(js) > 0 {
				return js, nil
			}
			return rec, err
		}
		return rc.svc.Wait(ctx, rc.caller, p)
	}),
	// exec.cancel (api.CancelParams) -> api.Record. Idempotent: a finished
	// execution answers its record.
	"exec.cancel": method("", Service.Cancel),
	// exec.signal (api.SignalParams) -> api.Record. signal is a name such as
	// "SIGINT"; target is "all" (default) or "main".
	"exec.signal": method("", Service.Signal),
	// exec.write (api.WriteParams) -> api.WriteResult. Writes base64 data to
	// the stdin of an execution started with stdin_open; close ends it.
	"exec.write": method("data", Service.Write),
	// exec.list (api.ListParams) -> api.ListResult: the caller's executions
	// (all of them for root) filtered by state and labels.
	"exec.list": method("", Service.List),
	// exec.output (api.OutputParams) -> api.OutputResult: kept output of one
	// stream from offset; gap is true when offset fell in the dropped middle.
	"exec.output": withParams("", func(ctx context.Context, rc *reqContext, p api.OutputParams) (any, error) {
		// wait_ms: parked in the service (no goroutine of ours waits)
		// while the connection has room for parked calls.
		if w, ok := rc.svc.(OutputWaiter); ok && p.WaitMS > 0 && p.WaitMS <= api.MaxWaitMS {
			if reply := rc.park(); reply != nil {
				// respond ignores the result when err is set.
				w.OutputWait(ctx, rc.caller, p, func(res api.OutputResult, err error) { reply(res, err) })
				return nil, errParked
			}
		}
		return rc.svc.Output(ctx, rc.caller, p)
	}),
	// exec.update (api.UpdateParams) -> api.Record: a new wall-clock
	// deadline, timeout_ms from now. -32602 once the execution has exited.
	"exec.update": method("", Service.Update),
	// exec.resize (api.ResizeParams) -> api.Record: sets the window size of
	// the execution's terminal. -32602 without a terminal.
	"exec.resize": method("", Service.Resize),
	// exec.follow (api.FollowParams) -> api.Record when the execution is
	// cleaned (or the connection closes). Meanwhile the connection carries
	// exec.output, exec.state and exec.heartbeat notifications; they may be
	// dropped when the client reads slowly (resume with exec.output from the
	// last offset seen). Every notification accepted before the response is
	// written before it.
	"exec.follow": withParams("", func(ctx context.Context, rc *reqContext, p api.FollowParams) (any, error) {
		return rc.svc.Follow(ctx, rc.caller, p, rc.notify)
	}),
	// daemon.info (no params) -> api.Info.
	"daemon.info": func(ctx context.Context, rc *reqContext, _ json.RawMessage) (any, error) {
		return rc.svc.Info(ctx)
	},
}
