package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deployDir is the module's deploy/ (deployPath).
func deployDir(t *testing.T) string {
	t.Helper()
	dir, err := deployPath()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func deployUnits(t *testing.T) map[string]string {
	t.Helper()
	units := map[string]string{}
	for _, name := range corraldUnits {
		data, err := os.ReadFile(filepath.Join(deployDir(t), name))
		if err != nil {
			t.Fatal(err)
		}
		units[name] = string(data)
	}
	return units
}

// TestDeployUnits loads the shipped units into a harness systemd: they must
// verify cleanly, load with the intended settings, and the socket must come
// up with the intended owner and mode.
func TestDeployUnits(t *testing.T) {
	sd := boot(t, Options{Units: deployUnits(t)})

	// Inside the harness's private mount namespace only: a "corral" group
	// (the socket's SocketGroup=) and an executable at the ExecStart= path,
	// so that neither verify nor the socket fails for want of them.
	run(t, sd, "sh", "-ec", `
		cp /etc/group `+InsideRoot+`/group
		grep -q '^corral:' `+InsideRoot+`/group || echo 'corral:x:4242:' >>`+InsideRoot+`/group
		mount --bind `+InsideRoot+`/group /etc/group
		mount -t tmpfs tmpfs /usr/local/bin
		printf '#!/bin/sh\nsystemd-notify --ready --pid=$$ --status=fake\nexec sleep 1000\n' >/usr/local/bin/corrald
		chmod 0755 /usr/local/bin/corrald`)

	// systemd-analyze verify: unknown keys, bad values and missing
	// dependencies are reported on stderr.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	verify := sd.RawCommand(ctx, "systemd-analyze", "verify",
		InsideUnitDir+"/corrald.service", InsideUnitDir+"/corrald.socket", InsideUnitDir+"/corral.slice")
	// Units the deploy ones refer to (sockets.target...) resolve in the
	// harness unit dir first, then the host's (read only, never run).
	verify.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+InsideUnitDir+":", "SYSTEMD_LOG_COLOR=0")
	if out, err := verify.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	tests := []struct {
		unit, prop, want string
	}{
		{"corrald.service", "LoadState", "loaded"},
		{"corrald.service", "Type", "notify"},
		{"corrald.service", "NotifyAccess", "main"},
		{"corrald.service", "Restart", "on-failure"},
		{"corrald.service", "FileDescriptorStoreMax", "5120"},
		{"corrald.service", "KillMode", "mixed"},
		{"corrald.service", "TimeoutStopUSec", "1min"},
		{"corrald.service", "NoNewPrivileges", "yes"},
		{"corrald.service", "ProtectSystem", "full"},
		{"corrald.service", "ProtectControlGroups", "no"},
		{"corrald.service", "ProtectKernelTunables", "no"},
		{"corrald.service", "PrivateNetwork", "no"},
		{"corrald.service", "Delegate", "no"},
		{"corrald.service", "StateDirectory", "corral"},
		{"corrald.service", "RuntimeDirectory", "corral"},
		{"corrald.service", "RuntimeDirectoryPreserve", "yes"},
		{"corrald.service", "ExecStart", "{ path=/usr/local/bin/corrald ; argv[]=/usr/local/bin/corrald ;"},
		{"corrald.socket", "LoadState", "loaded"},
		{"corrald.socket", "Listen", "/run/corral/corrald.sock (Stream)"},
		{"corrald.socket", "SocketMode", "0660"},
		{"corrald.socket", "SocketGroup", "corral"},
		{"corral.slice", "LoadState", "loaded"},
		{"corral.slice", "MemoryAccounting", "yes"},
		{"corral.slice", "TasksAccounting", "yes"},
	}
	for _, tt := range tests {
		got := run(t, sd, "systemctl", "show", "-p", tt.prop, "--value", tt.unit)
		if got != tt.want && !(tt.prop == "ExecStart" && strings.HasPrefix(got, tt.want)) {
			t.Errorf("%s %s = %q, want %q", tt.unit, tt.prop, got, tt.want)
		}
	}

	if got := run(t, sd, "systemctl", "show", "-p", "LoadError", "corrald.service", "corrald.socket", "corral.slice"); strings.Trim(strings.ReplaceAll(got, "LoadError=", ""), "\" \n") != "" {
		t.Errorf("LoadError: %s", got)
	}

	run(t, sd, "systemctl", "start", "corrald.socket")
	if got := run(t, sd, "systemctl", "is-active", "corrald.socket"); got != "active" {
		t.Errorf("corrald.socket is %q, want active", got)
	}
	if got := run(t, sd, "stat", "-c", "%F %a %U %G", "/run/corral/corrald.sock"); got != "socket 660 root corral" {
		t.Errorf("stat /run/corral/corrald.sock = %q, want %q", got, "socket 660 root corral")
	}

	// A stand-in corrald (notify READY, then sleep) must start under the
	// unit's sandboxing, get the socket, and be stopped cleanly.
	run(t, sd, "systemctl", "start", "corrald.service")
	for _, tt := range []struct{ prop, want string }{
		{"ActiveState", "active"},
		{"StatusText", "fake"},
		{"WatchdogUSec", "10s"},
	} {
		if got := run(t, sd, "systemctl", "show", "-p", tt.prop, "--value", "corrald.service"); got != tt.want {
			t.Errorf("running corrald.service %s = %q, want %q", tt.prop, got, tt.want)
		}
	}
	run(t, sd, "systemctl", "stop", "corrald.service")
	if got := run(t, sd, "stat", "-c", "%F", "/run/corral/corrald.sock"); got != "socket" {
		t.Errorf("after stopping the service, /run/corral/corrald.sock is %q, want the socket to stay", got)
	}
}

// TestInstallScript stages an install with DESTDIR twice (it must be
// idempotent) and checks what lands where.
func TestInstallScript(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"corrald", "corralctl", "corral-shim"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	stage := filepath.Join(tmp, "stage")
	for i := 0; i < 2; i++ {
		cmd := exec.Command("sh", filepath.Join(deployDir(t), "install.sh"))
		cmd.Env = append(os.Environ(), "DESTDIR="+stage, "BIN_SRC="+bin, "PREFIX=/opt/corral")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("install.sh run %d: %v\n%s", i+1, err, out)
		}
	}
	want := map[string]os.FileMode{
		"opt/corral/bin/corrald":             0o755,
		"opt/corral/bin/corralctl":           0o755,
		"opt/corral/bin/corral-shim":         0o755,
		"etc/systemd/system/corrald.service": 0o644,
		"etc/systemd/system/corrald.socket":  0o644,
		"etc/systemd/system/corral.slice":    0o644,
	}
	for rel, mode := range want {
		st, err := os.Stat(filepath.Join(stage, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode = %v, want %v", rel, st.Mode().Perm(), mode)
		}
	}
	svc, err := os.ReadFile(filepath.Join(stage, "etc/systemd/system/corrald.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svc), "\nExecStart=/opt/corral/bin/corrald\n") {
		t.Errorf("staged corrald.service does not run /opt/corral/bin/corrald:\n%s", svc)
	}
}
