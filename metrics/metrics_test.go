package metrics

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestListenLoopbackOnly: metrics listen on loopback or a Unix socket,
// never on an address other hosts reach.
func TestListenLoopbackOnly(t *testing.T) {
	for _, tt := range []struct {
		addr string
		want string // "" ok, else part of the error
	}{
		{"127.0.0.1:0", ""},
		{"localhost:0", ""},
		{"unix:" + filepath.Join(t.TempDir(), "m.sock"), ""},
		{filepath.Join(t.TempDir(), "m2.sock"), ""},
		{"0.0.0.0:9464", "not a loopback address"},
		{":9464", "not a loopback address"},
		{"192.0.2.1:9464", "not a loopback address"},
		{"example.com:9464", "not a loopback address"},
		{"unix:relative.sock", "absolute"},
		{"9464", "HOST:PORT"},
	} {
		ln, err := Listen(tt.addr)
		if tt.want == "" {
			if err != nil {
				t.Errorf("Listen(%q) = %v", tt.addr, err)
				continue
			}
			ln.Close()
			continue
		}
		if err == nil {
			ln.Close()
			t.Errorf("Listen(%q) = nil error, want one saying %q", tt.addr, tt.want)
		} else if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Listen(%q) = %v, want one saying %q", tt.addr, err, tt.want)
		}
	}
}
