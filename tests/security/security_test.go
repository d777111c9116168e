package security

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"

	"github.com/corral-dev/corral/tests/testenv"
)

// TestOtherUsersExecutionIsInvisible: every exec.* method that names B's
// execution answers A with -32001, exactly as for an id that does not exist,
// and exec.list does not show it to A. B's execution is unaffected.
func TestOtherUsersExecutionIsInvisible(t *testing.T) {
	d := startDaemon(t)
	a, b := users[userA], users[userB]
	r := d.as(b, call{"exec.start", map[string]any{"argv": []string{"sleep", "60"}, "cwd": "/", "stdin_open": true}})
	victim := r[0].record(t)
	t.Cleanup(func() { d.as(nil, call{"exec.cancel", map[string]any{"id": victim.ID}}) })
	mine := d.as(a, call{"exec.start", map[string]any{"argv": []string{"true"}, "cwd": "/"}})[0].record(t)

	data := base64.StdEncoding.EncodeToString([]byte("rm -rf ~\n"))
	attempts := func(id string) []call {
		return []call{
			{"exec.get", map[string]any{"id": id}},
			{"exec.wait", map[string]any{"id": id, "timeout_ms": 200}},
			{"exec.follow", map[string]any{"id": id}},
			{"exec.signal", map[string]any{"id": id, "signal": "SIGKILL"}},
			{"exec.write", map[string]any{"id": id, "data": data, "close": true}},
			{"exec.cancel", map[string]any{"id": id, "reason": "A says so"}},
			{"exec.output", map[string]any{"id": id, "stream": "stdout"}},
		}
	}
	// B's finished execution too: cleaned records may be served from the
	// store rather than memory.
	done, _, _ := d.run(b, map[string]any{"argv": []string{"echo", "B's output"}, "cwd": "/"})
	missing := d.as(a, attempts("no-such-execution")...)
	for _, v := range []struct {
		what, id string
	}{{"running", victim.ID}, {"cleaned", done.ID}} {
		for i, rep := range d.as(a, attempts(v.id)...) {
			if rep.Code != api.CodeNotFound {
				t.Errorf("%s of B's %s execution as A: code %d (%q, result %.200s), want %d", rep.Method, v.what, rep.Code, rep.Message, rep.Result, api.CodeNotFound)
				continue
			}
			if rep.Message != missing[i].Message {
				t.Errorf("%s of B's %s execution as A: message %q differs from a missing id's %q", rep.Method, v.what, rep.Message, missing[i].Message)
			}
		}
	}

	if ids := d.listIDs(a); slices.Contains(ids, victim.ID) || slices.Contains(ids, done.ID) || !slices.Contains(ids, mine.ID) {
		t.Errorf("exec.list as A = %v, want A's %s and not B's %s, %s", ids, mine.ID, victim.ID, done.ID)
	}
	if ids := d.listIDs(b); !slices.Contains(ids, victim.ID) || !slices.Contains(ids, done.ID) || slices.Contains(ids, mine.ID) {
		t.Errorf("exec.list as B = %v, want B's %s, %s and not A's %s", ids, victim.ID, done.ID, mine.ID)
	}
	if ids := d.listIDs(nil); !slices.Contains(ids, victim.ID) || !slices.Contains(ids, mine.ID) || !slices.Contains(ids, done.ID) {
		t.Errorf("exec.list as root = %v, want all of %s, %s, %s", ids, victim.ID, mine.ID, done.ID)
	}

	// None of A's attempts reached B's execution.
	after := d.as(b, call{"exec.get", map[string]any{"id": victim.ID}})[0].record(t)
	if after.State != api.StateRunning || after.CancelReason != "" {
		t.Errorf("B's execution after A's attempts: state %s, cancel reason %q; want running, none", after.State, after.CancelReason)
	}
	// B still can: the write reaches sleep's stdin, the cancel ends it.
	r = d.as(b,
		call{"exec.write", map[string]any{"id": victim.ID, "data": data}},
		call{"exec.cancel", map[string]any{"id": victim.ID, "reason": "test over"}},
		call{"exec.wait", map[string]any{"id": victim.ID}},
	)
	if r[0].Code != 0 {
		t.Errorf("exec.write by the owner: %d %q", r[0].Code, r[0].Message)
	}
	if rec := r[2].record(t); rec.Outcome == nil || *rec.Outcome != api.OutcomeCancelled {
		t.Errorf("B's execution after B's cancel: outcome %v, want cancelled", rec.Outcome)
	}
}

// TestChildRunsAsCaller: the child has the caller's uid, gid and the
// supplementary groups of the user database, whoever the daemon is.
func TestChildRunsAsCaller(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		for _, name := range []string{userA, userB} {
			t.Run(name, func(t *testing.T) {
				d := d.forTest(t)
				u := users[name]
				for _, network := range []string{"host", "none"} { // without and with the shim
					rec, out, errs := d.run(u, map[string]any{"argv": []string{"sh", "-c", "id -u; id -g; id -G"}, "cwd": "/", "network": network})
					if code := exitCode(t, rec); code != 0 {
						t.Fatalf("network %s: id exited %d: %s", network, code, errs)
					}
					lines := strings.Split(strings.TrimSpace(out), "\n")
					if len(lines) != 3 {
						t.Fatalf("network %s: id printed %q", network, out)
					}
					if want := strconv.Itoa(int(u.uid)); lines[0] != want {
						t.Errorf("network %s: uid = %s, want %s", network, lines[0], want)
					}
					if want := strconv.Itoa(int(u.gid)); lines[1] != want {
						t.Errorf("network %s: gid = %s, want %s", network, lines[1], want)
					}
					if got, want := sortedSet(strings.Fields(lines[2])), groupSet(u); !slices.Equal(got, want) {
						t.Errorf("network %s: groups = %v, want %v (from the user database, without the socket's group)", network, got, want)
					}
					if rec.Owner.UID != u.uid {
						t.Errorf("record owner uid = %d, want %d", rec.Owner.UID, u.uid)
					}
				}
			})
		}
	})
}

func sortedSet(s []string) []string {
	sort.Strings(s)
	return slices.Compact(s)
}

// groupSet is the groups a child of u must have: u's gid and its groups in
// the user database, except the socket's group, which corrald drops so a
// command cannot reach corrald through the caller's membership.
func groupSet(u *testUser) []string {
	sock, _ := lookupGroupID(socketGroup)
	s := []string{strconv.Itoa(int(u.gid))}
	for _, g := range u.groups {
		if int(g) != int(sock) || g == u.gid {
			s = append(s, strconv.Itoa(int(g)))
		}
	}
	return sortedSet(s)
}

// TestOnlyRootChoosesUser: a non-root caller asking for another user gets
// -32002 and nothing starts; root may.
func TestOnlyRootChoosesUser(t *testing.T) {
	d := startDaemon(t)
	a := users[userA]
	before := d.info().Total
	for _, other := range []string{"root", "0", userB} {
		r := d.as(a, call{"exec.start", map[string]any{"argv": []string{"id", "-u"}, "cwd": "/", "user": other}})
		if r[0].Code != api.CodePermission {
			t.Errorf("A starting as user %q: code %d %q (result %.80s), want %d", other, r[0].Code, r[0].Message, r[0].Result, api.CodePermission)
		}
	}
	if after := d.info().Total; after != before {
		t.Errorf("daemon.info total went from %d to %d: a refused start started something", before, after)
	}
	rec, out, _ := d.run(nil, map[string]any{"argv": []string{"id", "-u"}, "cwd": "/", "user": userB})
	if exitCode(t, rec) != 0 || strings.TrimSpace(out) != strconv.Itoa(int(users[userB].uid)) {
		t.Errorf("root starting as %s: id -u printed %q, want %d", userB, out, users[userB].uid)
	}
}

// TestSetuidBinaryCannotEscalate: a setuid-root copy of id(1) raises the
// effective uid to 0 when the test runs it as A directly, but not inside a
// child of corrald (no_new_privs).
func TestSetuidBinaryCannotEscalate(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		a := users[userA]
		suid := filepath.Join(d.dir, "suid-id")
		if err := copyFile("/usr/bin/id", suid, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(suid) })
		if err := os.Chown(suid, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(suid, 0o4755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		// Control: without no_new_privs the copy does escalate, so the check
		// below can fail.
		ctl := exec.Command(suid, "-u")
		ctl.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: a.groups}}
		out, err := ctl.Output()
		if err != nil {
			t.Fatalf("control run of %s as %s: %v", suid, a.name, err)
		}
		if strings.TrimSpace(string(out)) != "0" {
			testenv.Skipf(t, "setuid does not take effect here (nosuid mount or no_new_privs already set on the test): euid %s", out)
		}

		script := suid + " -u; grep NoNewPrivs /proc/self/status"
		for _, network := range []string{"host", "none"} {
			rec, out, errs := d.run(a, map[string]any{"argv": []string{"sh", "-c", script}, "cwd": "/", "network": network})
			if code := exitCode(t, rec); code != 0 {
				t.Fatalf("network %s: exit %d: %s", network, code, errs)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 2 {
				t.Fatalf("network %s: output %q", network, out)
			}
			if want := strconv.Itoa(int(a.uid)); lines[0] != want {
				t.Errorf("network %s: setuid-root id -u in the child printed euid %s, want %s", network, lines[0], want)
			}
			if f := strings.Fields(lines[1]); len(f) != 2 || f[1] != "1" {
				t.Errorf("network %s: child's /proc/self/status says %q, want NoNewPrivs: 1", network, lines[1])
			}
		}
	})
}

// TestDaemonEnvironmentDoesNotLeak: corrald runs with CORRAL_SECRET_TEST in
// its environment; the child's environment is the minimal base plus the
// request's variables.
func TestDaemonEnvironmentDoesNotLeak(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		a := users[userA]
		allowed := map[string]bool{"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "LANG": true,
			"SHELL": true, "TERM": true, "TZ": true, "FROM_REQUEST": true}
		for _, network := range []string{"host", "none"} {
			rec, out, errs := d.run(a, map[string]any{"argv": []string{"env"}, "cwd": "/", "network": network,
				"env": map[string]string{"FROM_REQUEST": "yes"}})
			if code := exitCode(t, rec); code != 0 {
				t.Fatalf("network %s: env exited %d: %s", network, code, errs)
			}
			vars := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				k, v, _ := strings.Cut(l, "=")
				vars[k] = v
			}
			if v, ok := vars["CORRAL_SECRET_TEST"]; ok {
				t.Errorf("network %s: the daemon's CORRAL_SECRET_TEST=%s reached the child", network, v)
			}
			for k := range vars {
				if !allowed[k] {
					t.Errorf("network %s: unexpected variable %s in the child's environment", network, k)
				}
			}
			if vars["FROM_REQUEST"] != "yes" || vars["USER"] != userA {
				t.Errorf("network %s: environment %v, want FROM_REQUEST=yes and USER=%s", network, vars, userA)
			}
		}
	})
}

// TestNetworkNoneCannotReachHostLoopback: a listener on the host's
// 127.0.0.1 is reachable with network "host" and not with "none", where
// the child has its own loopback (up: connecting is refused, not
// unreachable).
func TestNetworkNoneCannotReachHostLoopback(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		testenv.Skip(t, "bash not installed (needed for /dev/tcp)")
	}
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		a := users[userA]
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		port := ln.Addr().(*net.TCPAddr).Port
		accepted := make(chan struct{}, 4)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
				accepted <- struct{}{}
			}
		}()
		script := fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", port)

		rec, out, errs := d.run(a, map[string]any{"argv": []string{"bash", "-c", script}, "cwd": "/", "network": "host"})
		if exitCode(t, rec) != 0 || strings.TrimSpace(out) != "connected" {
			t.Fatalf("network host: exit %d, stdout %q, stderr %q; want connected", exitCode(t, rec), out, errs)
		}
		select {
		case <-accepted:
		case <-time.After(5 * time.Second):
			t.Fatal("network host: the listener saw no connection")
		}

		rec, out, errs = d.run(a, map[string]any{"argv": []string{"bash", "-c", script}, "cwd": "/", "network": "none"})
		if exitCode(t, rec) == 0 || strings.Contains(out, "connected") {
			t.Errorf("network none: exit %d, stdout %q: reached the host's loopback", exitCode(t, rec), out)
		}
		if !strings.Contains(errs, "refused") {
			t.Errorf("network none: stderr %q, want connection refused by the private loopback (is lo up?)", errs)
		}
		select {
		case <-accepted:
			t.Error("network none: the host's listener accepted a connection")
		case <-time.After(200 * time.Millisecond):
		}
	})
}

// TestWorkspaceRemovalStaysInside: a workspace with a read-only
// subdirectory and symlinks to /etc and to a directory of the test is
// removed at cleaned; what the links point to is untouched.
func TestWorkspaceRemovalStaysInside(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		a := users[userA]
		canaryDir := t.TempDir()
		canary := filepath.Join(canaryDir, "canary")
		if err := os.WriteFile(canary, []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(canaryDir, 0o755)
		script := "stat -c '%a %u %g' . && mkdir ro && touch ro/f && chmod 555 ro && " +
			"ln -s /etc etc-link && ln -s " + canaryDir + " canary-link && ln -s / root-link && pwd"
		rec, out, errs := d.run(a, map[string]any{"argv": []string{"sh", "-c", script}})
		if code := exitCode(t, rec); code != 0 {
			t.Fatalf("workspace script exited %d: %s", code, errs)
		}
		if rec.Workspace == nil {
			t.Fatal("record has no workspace")
		}
		ws := *rec.Workspace
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("script printed %q", out)
		}
		if want := fmt.Sprintf("700 %d %d", a.uid, a.gid); lines[0] != want {
			t.Errorf("workspace mode, uid, gid = %q, want %q", lines[0], want)
		}
		if lines[1] != ws {
			t.Errorf("child's cwd %q, record's workspace %q", lines[1], ws)
		}
		if want := filepath.Join(d.StateDir, "work", rec.ID); ws != want {
			t.Errorf("workspace = %q, want %q", ws, want)
		}
		if _, err := os.Lstat(ws); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("workspace %s after cleaned: %v, want it gone", ws, err)
		}
		if rec.Error != nil {
			t.Errorf("record error %q, want none", *rec.Error)
		}
		for _, f := range []string{"/etc/passwd", "/etc/hostname", canary} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("%s after the workspace was removed: %v", f, err)
			}
		}
	})
}

// TestCapsRefuseWithNothingStarted: over --max-running or --max-per-uid,
// exec.start answers -32003 and starts nothing.
func TestCapsRefuseWithNothingStarted(t *testing.T) {
	a, b := users[userA], users[userB]
	sleep := map[string]any{"argv": []string{"sleep", "60"}, "cwd": "/"}
	for _, tc := range []struct {
		name    string
		args    []string
		refused []*testUser // after one execution of A runs
		allowed []*testUser
	}{
		{"max-running", []string{"--max-running", "1", "--max-per-uid", "0"}, []*testUser{a, b}, nil},
		{"max-per-uid", []string{"--max-running", "10", "--max-per-uid", "1"}, []*testUser{a}, []*testUser{b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, tc.args...)
			t.Cleanup(func() {
				for _, id := range d.listIDs(nil) {
					d.as(nil, call{"exec.cancel", map[string]any{"id": id}})
				}
			})
			first := d.as(a, call{"exec.start", sleep})[0].record(t)
			for _, u := range tc.refused {
				r := d.as(u, call{"exec.start", sleep})
				if r[0].Code != api.CodeOverCapacity {
					t.Errorf("%s's start over the cap: code %d %q (result %.80s), want %d", u.name, r[0].Code, r[0].Message, r[0].Result, api.CodeOverCapacity)
				}
			}
			want := []string{first.ID}
			for _, u := range tc.allowed {
				want = append(want, d.as(u, call{"exec.start", sleep})[0].record(t).ID)
			}
			sort.Strings(want)
			if ids := d.listIDs(nil); !slices.Equal(ids, want) {
				t.Errorf("exec.list as root = %v, want only %v", ids, want)
			}
			if info := d.info(); info.Total != int64(len(want)) || info.Running != len(want) {
				t.Errorf("daemon.info total %d running %d, want %d each", info.Total, info.Running, len(want))
			}
		})
	}
}

// TestRedactedOutput: with redact, secrets the child prints (split across
// writes, so across pipe reads) never reach a client; total_bytes counts
// what the child wrote and nothing is reported truncated.
func TestRedactedOutput(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		a := users[userA]
		const (
			token  = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0"
			keyID  = "AKIAIOSFODNN7EXAMPLE"
			secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
			pemA   = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"
			pemB   = "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK"
		)
		// Each printf is its own write; the sleeps make separate pipe reads
		// likely, cutting through the middle of the token and the key block.
		script := "printf 'Authorization: Bearer eyJhbGciOiJIUzI1'; sleep 0.1; printf 'NiJ9.c2VjcmV0\\n';" +
			"printf 'id " + keyID + "\\naws_secret_access_key = " + secret + "\\n';" +
			"printf -- '-----BEGIN RSA PRIVATE KEY-----\\n" + pemA + "\\n'; sleep 0.1;" +
			"printf '" + pemB + "\\n-----END RSA PRIVATE KEY-----\\ndone\\n'"
		raw := "Authorization: Bearer " + token + "\nid " + keyID + "\naws_secret_access_key = " + secret + "\n" +
			"-----BEGIN RSA PRIVATE KEY-----\n" + pemA + "\n" + pemB + "\n-----END RSA PRIVATE KEY-----\ndone\n"
		want := "Authorization: Bearer [REDACTED]\nid [REDACTED]\naws_secret_access_key = [REDACTED]\n[REDACTED]\ndone\n"

		rec, out, errs := d.run(a, map[string]any{"argv": []string{"sh", "-c", script}, "cwd": "/", "redact": true})
		if code := exitCode(t, rec); code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		if out != want {
			t.Errorf("redacted stdout = %q, want %q", out, want)
		}
		for _, s := range []string{token, keyID, secret, pemA, pemB, "NiJ9"} {
			if strings.Contains(out, s) {
				t.Errorf("secret %q in the kept output", s)
			}
		}
		if rec.Stdout.TotalBytes != int64(len(raw)) {
			t.Errorf("stdout total_bytes = %d, want %d (what the child wrote)", rec.Stdout.TotalBytes, len(raw))
		}
		if rec.Stdout.KeptBytes != int64(len(want)) || rec.Stdout.Truncated {
			t.Errorf("stdout kept_bytes %d truncated %v, want %d and false (nothing was dropped)", rec.Stdout.KeptBytes, rec.Stdout.Truncated, len(want))
		}

		// Without redact the same output is kept as written.
		_, out, _ = d.run(a, map[string]any{"argv": []string{"sh", "-c", script}, "cwd": "/"})
		if out != raw {
			t.Errorf("stdout without redact = %q, want %q", out, raw)
		}
	})
}

// TestWorkspaceReachableByItsPath: tools resolve the working directory to
// an absolute path ($PWD, getcwd) and open files through it, so the
// workspace must be reachable by path for its user, not only entered.
func TestWorkspaceReachableByItsPath(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		rec, out, errs := d.run(users[userA], map[string]any{"argv": []string{"sh", "-c", `echo hi > f && cat "$(pwd)/f" && ls "$(pwd)" >/dev/null`}})
		if code := exitCode(t, rec); code != 0 || out != "hi\n" {
			t.Errorf("reading a workspace file by absolute path: exit %d, stdout %q, stderr %q", code, out, errs)
		}
	})
}

// TestPathProbesRevealNothing: the daemon checks argv[0] and cwd as root
// before the child runs; the answer must not tell the caller whether a
// path exists inside a directory the caller cannot search.
func TestPathProbesRevealNothing(t *testing.T) {
	// Checked before any spawn path is chosen.
	d := startDaemon(t)
	a := users[userA]
	private := t.TempDir() // 0700 root
	exe := filepath.Join(private, "tool")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(private, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	// errno of the failed start; running at all would be worse.
	errno := func(p map[string]any) string {
		rec, out, _ := d.run(a, p)
		if out != "" {
			t.Errorf("%v ran as %s: stdout %q", p, a.name, out)
		}
		if rec.Outcome == nil || *rec.Outcome != api.OutcomeStartFailed {
			t.Errorf("%v as %s: outcome %v, want start_failed", p, a.name, rec.Outcome)
		}
		return rec.StartErrno
	}
	for _, tc := range []struct {
		what            string
		exists, missing map[string]any
	}{
		{"argv[0]", map[string]any{"argv": []string{exe}, "cwd": "/"},
			map[string]any{"argv": []string{filepath.Join(private, "nope")}, "cwd": "/"}},
		{"cwd", map[string]any{"argv": []string{"true"}, "cwd": filepath.Join(private, "dir")},
			map[string]any{"argv": []string{"true"}, "cwd": filepath.Join(private, "nodir")}},
	} {
		// The user itself would get EACCES for both: it cannot search the
		// directory, so it cannot learn what is in it.
		if e, m := errno(tc.exists), errno(tc.missing); e != m {
			t.Errorf("%s in a directory %s cannot search: an existing path fails with %s, a missing one with %s", tc.what, a.name, e, m)
		}
	}
}

// TestChildGetsNoDaemonFds: the child's only open fds are its stdin,
// stdout and stderr, even when the daemon itself inherited more (its
// starter's fds without close-on-exec: startDaemon passes one).
func TestChildGetsNoDaemonFds(t *testing.T) {
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		for _, network := range []string{"host", "none"} {
			rec, out, errs := d.run(users[userA], map[string]any{"argv": []string{"ls", "-l", "/proc/self/fd/"}, "cwd": "/", "network": network})
			if code := exitCode(t, rec); code != 0 {
				t.Fatalf("network %s: ls exited %d: %s", network, code, errs)
			}
			var extra []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(l)
				if len(f) < 11 || f[0] == "total" {
					continue
				}
				fd, target := f[8], f[len(f)-1]
				switch {
				case fd == "0" || fd == "1" || fd == "2":
				case strings.HasPrefix(target, "/proc/") && strings.HasSuffix(target, "/fd"): // ls reading the directory
				default:
					extra = append(extra, fd+" -> "+target)
				}
			}
			if len(extra) > 0 {
				t.Errorf("network %s: the child inherited fds %q", network, extra)
			}
		}
	})
}

// TestNetworkNoneCannotEscapeThroughDaemon: a network-none child that can
// reach corrald's socket (its user is in the socket's group) must not get
// the host's loopback by asking corrald for a network-host execution.
func TestNetworkNoneCannotEscapeThroughDaemon(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		testenv.Skip(t, "bash not installed (needed for /dev/tcp)")
	}
	forEachSpawnPath(t, func(t *testing.T, d *daemon) {
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		inner := fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", ln.Addr().(*net.TCPAddr).Port)
		rec, out, errs := d.run(users[userA], map[string]any{
			"argv":    []string{filepath.Join(binDir, "corralctl"), "run", "--cwd", "/", "--", "bash", "-c", inner},
			"cwd":     "/",
			"network": "none",
			"env":     map[string]string{"CORRAL_SOCKET": d.Socket},
		})
		if strings.Contains(out, "connected") {
			t.Errorf("a network-none child reached the host's loopback through corrald (exit %d): stdout %q stderr %q", exitCode(t, rec), out, errs)
		}
	})
}

// TestSocketOnlyForItsGroup: the socket is 0660 with the configured group,
// the state directory 0700; a user's process without the group cannot
// connect at all.
func TestSocketOnlyForItsGroup(t *testing.T) {
	d := startDaemon(t)
	a := users[userA]
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{d.Socket, 0o660}, {d.StateDir, 0o711}} { // 0711: traversable to reach a workspace, not listable
		fi, err := os.Stat(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != f.mode {
			t.Errorf("%s mode = %o, want %o", f.path, got, f.mode)
		}
	}
	fi, _ := os.Stat(d.Socket)
	g, err := lookupGroupID(socketGroup)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != g {
		t.Errorf("socket group = %d, want %s (%d)", st.Gid, socketGroup, g)
	}

	cmd := exec.Command(testBin)
	cmd.Dir = "/"
	cmd.Env = []string{clientModeEnv + "=1", callsEnv + `=[{"method":"daemon.info"}]`, socketEnv + "=" + d.Socket}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied") {
		t.Errorf("%s without group %s: err %v, output %q; want permission denied", a.name, socketGroup, err, out)
	}
}

func lookupGroupID(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("look up group %s: %w", name, err)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(n), err
}
