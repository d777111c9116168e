package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// stockUnits are the only units the harness systemd can see besides
// Options.Units. They are written by hand rather than copied from
// /lib/systemd/system: the stock ones pull in units that touch the host
// (systemd-journald-dev-log.socket symlinks /dev/log on the shared devtmpfs)
// or need features a test box may lack (IPAddressDeny needs BPF).
var stockUnits = map[string]string{
	"sysinit.target": `[Unit]
Description=System Initialization (corral harness stub)
DefaultDependencies=no
`,
	"sockets.target": `[Unit]
Description=Socket Units (corral harness stub)
DefaultDependencies=no
`,
	"basic.target": `[Unit]
Description=Basic System (corral harness stub)
DefaultDependencies=no
Requires=sysinit.target
Wants=sockets.target
After=sysinit.target sockets.target
`,
	"shutdown.target": `[Unit]
Description=Shutdown (corral harness stub)
DefaultDependencies=no
RefuseManualStart=yes
`,
	"system.slice": `[Unit]
Description=System Slice
Documentation=man:systemd.special(7)
DefaultDependencies=no
Before=slices.target
`,
	"systemd-journald.socket": `[Unit]
Description=Journal Socket
DefaultDependencies=no
Before=sockets.target

[Socket]
ListenDatagram=/run/systemd/journal/socket
ListenStream=/run/systemd/journal/stdout
PassCredentials=yes
PassSecurity=yes
ReceiveBuffer=8M
Service=systemd-journald.service
SocketMode=0666
Timestamping=us
`,
	"systemd-journald.service": `[Unit]
Description=Journal Service
DefaultDependencies=no
Requires=systemd-journald.socket
After=systemd-journald.socket
Before=sysinit.target

[Service]
Type=notify
ExecStart=/lib/systemd/systemd-journald
Sockets=systemd-journald.socket
FileDescriptorStoreMax=4224
Restart=always
RestartSec=0
RuntimeDirectory=systemd/journal
RuntimeDirectoryPreserve=yes
StandardOutput=null
`,
	"dbus.socket": `[Unit]
Description=D-Bus System Message Bus Socket

[Socket]
ListenStream=/run/dbus/system_bus_socket
`,
	"dbus.service": `[Unit]
Description=D-Bus System Message Bus
Requires=dbus.socket

[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/bin/dbus-daemon --system --address=systemd: --nofork --nopidfile --systemd-activation --syslog-only
`,
}

// targetUnit is TargetName: basic.target, the journal, D-Bus, plus start.
func targetUnit(start []string) string {
	wants := []string{"basic.target", "systemd-journald.socket", "systemd-journald.service", "dbus.socket", "dbus.service"}
	wants = append(wants, start...)
	return fmt.Sprintf(`[Unit]
Description=corral test harness
Requires=basic.target
Wants=%s
After=basic.target
AllowIsolate=yes
`, strings.Join(wants, " "))
}

// writeUnits fills dir with the stock units, the target and extra.
func writeUnits(dir string, extra map[string]string, start []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create unit dir: %w", err)
	}
	all := make(map[string]string, len(stockUnits)+len(extra)+1)
	for name, body := range stockUnits {
		all[name] = body
	}
	all[TargetName] = targetUnit(start)
	for name, body := range extra {
		if name == "" || strings.ContainsRune(name, '/') {
			return fmt.Errorf("write unit %q: bad unit name", name)
		}
		all[name] = body
	}
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(all[name]), 0o644); err != nil {
			return fmt.Errorf("write unit %s: %w", name, err)
		}
	}
	return nil
}
