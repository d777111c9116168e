// Package deb builds corral's Debian package with `make deb` and checks it:
// its metadata and contents with dpkg-deb, lintian, and an installation with
// dpkg inside a private systemd booted by tests/harness (on overlays of
// /usr, /etc and /var/lib in the harness's mount namespace, so the host is
// untouched), whose maintainer scripts must create the group, enable the
// units and start the socket, and whose corrald must then run a command.
package deb

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/tests/harness"

	"github.com/corral-dev/corral/tests/testenv"
)

var (
	buildOnce sync.Once
	debPath   string
	buildErr  string
)

// buildDeb runs `make deb` once for the package, into a temp directory,
// and returns the .deb's path.
func buildDeb(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("CORRAL_TEST_DEB"); p != "" { // a package built already
			debPath = p
			return
		}
		_, file, _, _ := runtime.Caller(0)
		repo := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "corral-deb-")
		if err != nil {
			buildErr = err.Error()
			return
		}
		cmd := exec.Command("make", "-s", "-C", repo, "deb", "BIN="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = "make deb: " + err.Error() + "\n" + string(out)
			return
		}
		// make deb's last line: "built PATH".
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		debPath = strings.TrimPrefix(lines[len(lines)-1], "built ")
	})
	if buildErr != "" {
		t.Fatal(buildErr)
	}
	return debPath
}

func TestMain(m *testing.M) {
	code := testenv.Main(m)
	if debPath != "" && os.Getenv("CORRAL_TEST_DEB") == "" {
		os.RemoveAll(filepath.Dir(debPath))
	}
	os.Exit(code)
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPackageMetadata: dpkg-deb --info shows the control fields and the
// maintainer scripts, which parse as sh.
func TestPackageMetadata(t *testing.T) {
	deb := buildDeb(t)
	info := output(t, "dpkg-deb", "--info", deb)
	for _, want := range []string{
		" Package: corral\n", " Architecture: " + strings.TrimSpace(output(t, "dpkg", "--print-architecture")) + "\n",
		" Depends: init-system-helpers (>= 1.54~), adduser\n", " Section: admin\n", " Version: 0~git",
		" postinst", " prerm", " postrm", " md5sums",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb --info lacks %q:\n%s", want, info)
		}
	}
	ctrl := t.TempDir()
	output(t, "dpkg-deb", "--control", deb, ctrl)
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		output(t, "sh", "-n", filepath.Join(ctrl, s))
	}
	post, _ := os.ReadFile(filepath.Join(ctrl, "postinst"))
	for _, want := range []string{"addgroup --system", "deb-systemd-helper enable", "deb-systemd-invoke start corrald.socket"} {
		if !strings.Contains(string(post), want) {
			t.Errorf("postinst lacks %q", want)
		}
	}
}

// TestPackageContents: dpkg-deb --contents lists exactly the binaries,
// units, preset, man pages, completions and docs, root-owned.
func TestPackageContents(t *testing.T) {
	deb := buildDeb(t)
	var files []string
	for _, l := range strings.Split(strings.TrimSpace(output(t, "dpkg-deb", "--contents", deb)), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb --contents line %q", l)
		}
		if f[1] != "root/root" {
			t.Errorf("%s is owned by %s, want root/root", f[5], f[1])
		}
		if strings.HasPrefix(f[0], "-") {
			files = append(files, strings.TrimPrefix(f[5], "."))
		}
	}
	sort.Strings(files)
	want := []string{
		"/lib/systemd/system-preset/80-corral.preset",
		"/lib/systemd/system/corral.slice",
		"/lib/systemd/system/corrald.service",
		"/lib/systemd/system/corrald.socket",
		"/usr/bin/corral-shim",
		"/usr/bin/corralctl",
		"/usr/bin/corrald",
		"/usr/share/bash-completion/completions/corralctl",
		"/usr/share/doc/corral/changelog.gz",
		"/usr/share/doc/corral/copyright",
		"/usr/share/fish/vendor_completions.d/corralctl.fish",
		"/usr/share/lintian/overrides/corral",
		"/usr/share/man/man1/corralctl.1.gz",
		"/usr/share/man/man8/corrald.8.gz",
		"/usr/share/zsh/vendor-completions/_corralctl",
	}
	if strings.Join(files, "\n") != strings.Join(want, "\n") {
		t.Errorf("package files:\n%s\nwant:\n%s", strings.Join(files, "\n"), strings.Join(want, "\n"))
	}
}

// TestLintian: lintian finds nothing to say about the package.
func TestLintian(t *testing.T) {
	deb := buildDeb(t)
	if _, err := exec.LookPath("lintian"); err != nil {
		t.Fatalf("lintian is not installed (.ci/run installs it): %v", err)
	}
	out, err := exec.Command("lintian", "--tag-display-limit", "0", deb).CombinedOutput()
	var tags []string
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && !strings.Contains(l, "running with root privileges") {
			tags = append(tags, l)
		}
	}
	if err != nil || len(tags) > 0 {
		t.Errorf("lintian: %v\n%s", err, strings.Join(tags, "\n"))
	}
}

// TestInstallStartsSocket installs the package with dpkg inside a private
// systemd and checks what the maintainer scripts did (the corral group, the
// units enabled, the socket started and listening as root:corral 0660),
// then runs a command through the installed corralctl, which starts the
// installed corrald by socket activation. Purging then removes it all.
func TestInstallStartsSocket(t *testing.T) {
	deb := buildDeb(t)
	harness.SkipUnlessBootable(t)
	sd, err := harness.Boot(harness.Options{})
	if err != nil {
		t.Fatalf("Boot: %v", err)
	}
	t.Cleanup(func() {
		if err := sd.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	run := func(script string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := sd.RawCommand(ctx, "sh", "-ec", script).CombinedOutput()
		if err != nil {
			t.Fatalf("inside: %v\n%s\n%s", err, script, out)
		}
		return strings.TrimSpace(string(out))
	}
	// Overlays in the harness's mount namespace: dpkg writes /usr, /etc
	// and /var/lib (its database) there, never on the host. The harness
	// systemd reads units only from its unit dir, so the package's units
	// are linked there before they exist: once dpkg has unpacked them,
	// postinst's daemon-reload and start find them.
	run(`
		for d in usr etc var/lib; do
			mkdir -p /run/deb-overlay/$d/upper /run/deb-overlay/$d/work
			mount -t overlay overlay -o lowerdir=/$d,upperdir=/run/deb-overlay/$d/upper,workdir=/run/deb-overlay/$d/work /$d
		done
		for u in corrald.socket corrald.service corral.slice; do
			ln -s /lib/systemd/system/$u ` + harness.InsideUnitDir + `/$u
		done
		# Likewise the enablement links deb-systemd-helper will make in
		# /etc, so that this systemd sees the units as enabled (and
		# deb-systemd-invoke agrees to start them).
		for w in sockets.target.wants/corrald.socket multi-user.target.wants/corrald.service; do
			mkdir -p ` + harness.InsideUnitDir + `/${w%/*}
			ln -s /etc/systemd/system/$w ` + harness.InsideUnitDir + `/$w
		done
		! getent group corral || groupdel corral
		# Container images forbid service starts (policy-rc.d exits 101); a
		# host does not.
		rm -f /usr/sbin/policy-rc.d`)
	out := run(`dpkg -i ` + harness.InsidePath(deb) + ` 2>&1`)
	t.Logf("dpkg -i:\n%s", out)

	if got := run(`getent group corral | cut -d: -f1`); got != "corral" {
		t.Errorf("group corral after install: %q", got)
	}
	if got := run(`dpkg-query -W -f '${db:Status-Abbrev}' corral`); strings.TrimSpace(got) != "ii" {
		t.Errorf("dpkg-query status = %q, want ii", got)
	}
	// Enabled the Debian way: deb-systemd-helper's symlinks in /etc.
	if got := run(`readlink /etc/systemd/system/sockets.target.wants/corrald.socket /etc/systemd/system/multi-user.target.wants/corrald.service`); got != "/lib/systemd/system/corrald.socket\n/lib/systemd/system/corrald.service" {
		t.Errorf("enablement symlinks point at %q", got)
	}
	if got := run(`systemctl is-active corrald.socket`); got != "active" {
		t.Errorf("corrald.socket after install is %q, want active (started by postinst)", got)
	}
	if got := run(`stat -c '%F %a %U %G' /run/corral/corrald.sock`); got != "socket 660 root corral" {
		t.Errorf("socket = %q, want \"socket 660 root corral\"", got)
	}
	// The installed client, the installed daemon (socket-activated, the
	// systemd backend), the installed shim.
	if got := run(`corralctl run -- sh -c 'echo hello from $(basename $(readlink /proc/$PPID/exe))'`); got != "hello from corral-shim" && got != "hello from corrald" {
		t.Errorf("corralctl run = %q, want hello from the installed corral-shim", got)
	}
	info := run(`corralctl info`)
	for _, want := range []string{"/usr/bin/corral-shim", "systemd"} {
		if !strings.Contains(info, want) {
			t.Errorf("corralctl info lacks %q:\n%s", want, info)
		}
	}
	if got := run(`man -w corrald corralctl`); got != "/usr/share/man/man8/corrald.8.gz\n/usr/share/man/man1/corralctl.1.gz" {
		t.Errorf("man -w = %q", got)
	}

	run(`dpkg --purge corral >/dev/null 2>&1`)
	if got := run(`systemctl is-active corrald.socket corrald.service || true`); got != "inactive\ninactive" && !strings.Contains(got, "inactive") {
		t.Errorf("after purge the units are %q, want inactive", got)
	}
	if got := run(`ls /usr/bin/corrald /etc/systemd/system/sockets.target.wants/corrald.socket /var/lib/corral 2>&1 || true`); !strings.Contains(got, "No such file") || strings.Contains(got, "\n/") {
		t.Errorf("after purge: %s", got)
	}
}
