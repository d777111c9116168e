// Package ipc is corral's JSON-RPC 2.0 transport over a Unix stream socket:
// the server that frames requests, authenticates peers with SO_PEERCRED and
// dispatches to a Service, and the Go client used by corralctl and tests.
package ipc

import (
	"context"
	"encoding/json"

	"github.com/corral-dev/corral/api"
)

// Service is what the server dispatches to; the reactor implements it.
// Every method may be called from many goroutines at once. caller is the
// peer's SO_PEERCRED identity. Errors of type *api.Error carry the JSON-RPC
// code and the client-visible message; any other error is -32603.
type Service interface {
	Start(ctx context.Context, caller api.Owner, p api.StartParams) (api.Record, error)
	Get(ctx context.Context, caller api.Owner, p api.IDParams) (api.Record, error)
	Wait(ctx context.Context, caller api.Owner, p api.WaitParams) (api.Record, error)
	Cancel(ctx context.Context, caller api.Owner, p api.CancelParams) (api.Record, error)
	Signal(ctx context.Context, caller api.Owner, p api.SignalParams) (api.Record, error)
	Write(ctx context.Context, caller api.Owner, p api.WriteParams) (api.WriteResult, error)
	List(ctx context.Context, caller api.Owner, p api.ListParams) (api.ListResult, error)
	Output(ctx context.Context, caller api.Owner, p api.OutputParams) (api.OutputResult, error)
	// Follow streams notifications through notify until the execution is
	// cleaned (or ctx ends), then returns the final record. notify must not
	// block: it returns false when the notification was dropped because the
	// connection is slow (the client resumes with exec.output). The reactor
	// may call notify from its loop goroutine. notify encodes params before
	// it returns, so the caller may reuse any buffer in params afterwards;
	// params that are a json.RawMessage are taken as encoded by
	// encoding/json already (compact, HTML-escaped) and sent as they are;
	// once Follow has returned, notify refuses everything (returns false).
	// The notifications notify accepted reach the client before Follow's
	// response.
	Follow(ctx context.Context, caller api.Owner, p api.FollowParams, notify func(method string, params any) bool) (api.Record, error)
	Info(ctx context.Context) (api.Info, error)
	// Update moves a running execution's wall-clock deadline (exec.update).
	Update(ctx context.Context, caller api.Owner, p api.UpdateParams) (api.Record, error)
	// Resize sets the window size of an execution's terminal (exec.resize).
	Resize(ctx context.Context, caller api.Owner, p api.ResizeParams) (api.Record, error)
}

// EncodedWaiter is implemented by a Service that can answer exec.wait with
// the record already encoded by encoding/json (compact, HTML-escaped: the
// reactor has the store's JSON of the cleaned record): WaitEncoded is Wait,
// and also returns that encoding of rec when it has one (nil otherwise).
// The server then sends those bytes instead of encoding rec again.
type EncodedWaiter interface {
	WaitEncoded(ctx context.Context, caller api.Owner, p api.WaitParams) (rec api.Record, js json.RawMessage, err error)
}

// EncodedStarter is EncodedWaiter for exec.start: StartEncoded is Start,
// and also returns the encoding of rec by encoding/json when it has one
// (the reactor has the store's JSON of the running record), nil otherwise.
type EncodedStarter interface {
	StartEncoded(ctx context.Context, caller api.Owner, p api.StartParams) (rec api.Record, js json.RawMessage, err error)
}

// OutputWaiter is implemented by a Service that can park an exec.output
// call with wait_ms without holding a goroutine for it: OutputWait returns
// at once and calls reply exactly once, later, from any goroutine (the
// reactor calls it from its loop goroutine), when data arrives, the stream
// ends, wait_ms passes or ctx ends. reply must not block. The server uses
// it for up to Server.MaxParked calls per connection and calls Output
// (which then waits on the request's goroutine) beyond that.
type OutputWaiter interface {
	OutputWait(ctx context.Context, caller api.Owner, p api.OutputParams, reply func(api.OutputResult, error))
}
