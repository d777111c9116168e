package scope

import (
	"context"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/rs/zerolog"
)

// SystemdOptions configure the systemd backend (NewSystemd). The zero value
// is ready to use.
type SystemdOptions struct {
	// Slice is the slice every scope goes into; default DefaultSlice.
	// systemd creates a slice on demand when no unit file defines it.
	Slice string
	// JobTimeout bounds each wait for systemd (a start or stop job, a unit
	// going away) when the caller's context has no earlier deadline;
	// default 30 s.
	JobTimeout time.Duration
	// Dial opens a connection to systemd. Default: the private socket
	// /run/systemd/private when running as root (no dbus-daemon needed),
	// else the system bus. The backend calls it again to reconnect after the
	// connection broke.
	Dial func(ctx context.Context) (*sddbus.Conn, error)
	// Log receives reconnects and best-effort failures. The zero Logger
	// discards them.
	Log zerolog.Logger
}

// DefaultSlice is the slice of corral's scopes.
const DefaultSlice = "corral.slice"

// ScopePrefix and ScopeSuffix frame a systemd scope's unit name:
// "corral-<id>.scope".
const (
	ScopePrefix = "corral-"
	ScopeSuffix = ".scope"
)
