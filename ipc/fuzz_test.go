package ipc

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
)

// FuzzDispatchLine feeds arbitrary lines through validation and dispatch:
// nothing may panic, and every message queued for the client must be one
// line of valid JSON.
func FuzzDispatchLine(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"exec.get","params":{"id":"x"}}`,
		`{"jsonrpc":"2.0","id":"a","method":"exec.start","params":{"argv":["a"],"labels":{"k":1},"stdin":"!!"}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{"id":"x","timeout_ms":1e99}},5,[]]`,
		`{"jsonrpc":"2.0","method":"exec.cancel","params":{"id":"panic"}}`,
		`{"jsonrpc":"2.0","id":null,"method":"daemon.info","params":null}`,
		`{"jsonrpc":"2.0","id":-1.5e3,"method":"exec.list","params":{"labels":[]}}`,
		`[]`, `[[]]`, `{`, `"x"`, `null`, ` `, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"exec.get\",\"params\":{\"id\":\"\\ud800\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		srv := NewServer(newFake(), zerolog.Nop())
		c := newConn(srv, nil, api.Owner{UID: 1})
		c.dispatchLine(bytes.Clone(line))
		c.cancel() // ends an exec.wait of "block", which would wait forever
		c.handlers.Wait()
		c.out.seal()
		for {
			it, ok := c.out.pop()
			if !ok {
				break
			}
			if len(it.b) == 0 || it.b[len(it.b)-1] != '\n' || bytes.Count(it.b, []byte{'\n'}) != 1 {
				t.Fatalf("queued message is not one line: %q", it.b)
			}
			if !json.Valid(it.b) {
				t.Fatalf("queued message is not JSON: %q", it.b)
			}
		}
	})
}
