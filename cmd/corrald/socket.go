package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/systemd"
)

// listen returns the socket-activated listener if systemd passed one, else
// creates the socket with the configured mode and group.
func listen(c *config, sv *survival, log zerolog.Logger) (*net.UnixListener, bool, error) {
	socks := sv.passed.Sockets
	sv.passed.Sockets = nil
	// A handover passes the socket this daemon created itself under
	// ListenerName: not socket-activated, but already listening.
	own := len(socks) > 0 && socks[0].Name() == systemd.ListenerName
	lns, err := systemd.ListenersFrom(socks)
	if err != nil {
		return nil, false, fmt.Errorf("socket activation: %w", err)
	}
	if len(lns) > 0 {
		for _, extra := range lns[1:] {
			extra.Close()
		}
		return lns[0], !own, nil
	}
	if err := os.MkdirAll(filepath.Dir(c.socket), 0o755); err != nil {
		return nil, false, fmt.Errorf("socket directory: %w", err)
	}
	if err := removeStaleSocket(c.socket); err != nil {
		return nil, false, err
	}
	// Create it with no permissions, then open it up: no window in which a
	// stranger could connect.
	old := unix.Umask(0o777)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.socket, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, false, err // "listen unix PATH: bind: ...", from net
	}
	ln.SetUnlinkOnClose(false)
	gid := -1
	if c.socketGroup != "" {
		if g, err := user.LookupGroup(c.socketGroup); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		} else {
			log.Warn().Str("group", c.socketGroup).Msg("socket group does not exist; only root can use the socket")
		}
	}
	if err := os.Chown(c.socket, -1, gid); err != nil {
		ln.Close()
		return nil, false, fmt.Errorf("socket: %w", err)
	}
	if err := os.Chmod(c.socket, os.FileMode(c.socketMode)); err != nil {
		ln.Close()
		return nil, false, fmt.Errorf("socket: %w", err)
	}
	return ln, false, nil
}

// removeStaleSocket removes a socket left by a dead daemon, and refuses to
// start if a live daemon answers on it.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("socket %s: exists and is not a socket", path)
	}
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("socket %s: another corrald is listening", path)
	}
	return os.Remove(path)
}
