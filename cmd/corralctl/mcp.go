package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// `corralctl mcp`: a Model Context Protocol server on stdio that gives an
// agent corral as its shell tool (docs/mcp.md). The official Go SDK speaks
// the protocol; this file wires the session (mcp_session.go) and its tools
// (mcp_tools.go) to it.
//
// The server runs until the client closes its end of stdin, then exits 0.
// Executions it started keep running in corrald (their ids stay valid for
// another session and for corralctl) unless --cancel-on-exit was given.

func init() {
	commands["mcp"] = &command{"mcp [--cancel-on-exit]", "serve the Model Context Protocol on stdin/stdout: corral as an agent's shell tool", cmdMCP}
}

func cmdMCP(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "mcp")
	cancelOnExit := fs.Bool("cancel-on-exit", false, "cancel the executions this session started when the client disconnects")
	if _, code, ok := parseArgs(e, fs, args, 0, exitUsage); !ok {
		return code
	}
	s := newMCPSession(g.socketPath(e))
	srv := newMCPServer(s, slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	stdio := newMCPStdio(e.stdin, e.stdout, func(format string, args ...any) {
		fmt.Fprintf(e.stderr, "corralctl: "+format+"\n", args...)
	})
	err := srv.Run(context.Background(), &mcp.IOTransport{Reader: stdio, Writer: stdio.out})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	s.close(ctx, *cancelOnExit)
	cancel()
	if err != nil && !isClientGone(err) {
		return fail(e, exitErrorGeneric, "mcp: %v", err)
	}
	return 0
}

// isClientGone reports the errors of a client that closed stdin or stdout.
func isClientGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, io.ErrClosedPipe) ||
		strings.Contains(err.Error(), "broken pipe") || strings.Contains(err.Error(), "file already closed")
}

// newMCPServer builds the server with s's tools.
func newMCPServer(s *mcpSession, logger *slog.Logger) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "corral", Title: "corral: supervised shell for agents", Version: buildVersion()}, &mcp.ServerOptions{
		Instructions: "Run shell commands with exec_command; each runs under corrald in its own process tree with a timeout, " +
			"and keeps running if it outlasts yield_time_ms: then use read_output, write_stdin (with tty: true for REPLs) " +
			"or cancel_execution with its id.",
		Logger: logger,
	})
	s.registerTools(srv)
	srv.AddReceivingMiddleware(toolErrorsAsResults(toolNames))
	return srv
}

// toolNames are the tools registerTools adds.
var toolNames = []string{"exec_command", "write_stdin", "read_output", "list_executions", "cancel_execution"}

// toolErrorsAsResults answers a call of an unknown tool with an isError
// result naming the tools, instead of the SDK's JSON-RPC error, so that the
// model sees the mistake and can correct it; and it adds to the SDK's
// argument-validation errors what to do about them.
func toolErrorsAsResults(names []string) mcp.Middleware {
	known := make(map[string]bool, len(names))
	for _, n := range names {
		known[n] = true
	}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "tools/call" {
				return next(ctx, method, req)
			}
			p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
			if ok && !known[p.Name] {
				return textError(fmt.Sprintf("unknown tool %q; this server has %s (see tools/list)", p.Name, strings.Join(names, ", "))), nil
			}
			res, err := next(ctx, method, req)
			if r, isCall := res.(*mcp.CallToolResult); err == nil && isCall && r.IsError && len(r.Content) == 1 {
				if t, isText := r.Content[0].(*mcp.TextContent); isText && strings.HasPrefix(t.Text, "validating \"arguments\"") {
					t.Text = fmt.Sprintf("invalid arguments for %s: %s. Call it again with arguments that match its inputSchema (tools/list).", p.Name, t.Text)
				}
			}
			return res, err
		}
	}
}

// buildVersion is the module version corralctl was built from, or "dev".
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func textError(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// schemaFor is the input schema of T with the given defaults (applied by
// the SDK to missing arguments) and enums, integer fields at least 0, and
// no properties beyond T's.
func schemaFor[T any](defaults map[string]any, enums map[string][]any) *jsonschema.Schema {
	sc, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("schema of %T: %v", *new(T), err))
	}
	zero := 0.0
	for name, p := range sc.Properties {
		// A Go slice or map may be nil, so it is inferred as ["null",
		// "array"]; an argument is simply left out instead.
		if len(p.Types) == 2 && p.Types[0] == "null" {
			p.Type, p.Types = p.Types[1], nil
		}
		if p.Type == "integer" || (len(p.Types) > 0 && p.Types[len(p.Types)-1] == "integer") {
			p.Minimum = &zero
		}
		if v, ok := defaults[name]; ok {
			b, _ := json.Marshal(v)
			p.Default = b
		}
		if e, ok := enums[name]; ok {
			p.Enum = e
		}
	}
	// Arguments with defaults are not required of the caller.
	req := sc.Required[:0]
	for _, r := range sc.Required {
		if _, ok := defaults[r]; !ok {
			req = append(req, r)
		}
	}
	sc.Required = req
	return sc
}
