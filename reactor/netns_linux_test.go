package reactor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/internal/peerns"
	"github.com/corral-dev/corral/tests/testenv"
)

// A caller keeps the host's network only when its network namespace was
// resolved at accept and is the daemon's: one resolved in another
// namespace, or one whose namespace is unknown, is given network "none".
// The decision is on the namespace resolved at accept, not on what the
// caller's pid names now: a pid reused by a host-namespace process (here:
// this process's pid) does not give the host's network to a caller that
// connected from another namespace.
func TestOtherNetnsFailsClosed(t *testing.T) {
	me := int32(os.Getpid())
	if other, err := otherNetns(testCaller(0)); other || err != nil {
		t.Errorf("otherNetns(caller resolved in the daemon's namespace) = %v, %v; want false, nil", other, err)
	}
	if other, err := otherNetns(api.Owner{}); other || err != nil {
		t.Errorf("otherNetns(in-process caller) = %v, %v; want false, nil", other, err)
	}
	if other, err := otherNetns(api.Owner{PID: me}); !other || !errors.Is(err, errNetnsUnresolved) {
		t.Errorf("otherNetns(caller with a live host-namespace pid, nothing resolved) = %v, %v; want true, %v", other, err, errNetnsUnresolved)
	}
	unknown := &api.NetNS{Err: os.ErrNotExist}
	if other, err := otherNetns(api.Owner{PID: me, Netns: unknown}); !other || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("otherNetns(caller whose namespace was unknown at accept, its pid now a host-namespace process) = %v, %v; want true, ENOENT", other, err)
	}
	if other, err := otherNetns(api.Owner{Netns: unknown}); !other || err == nil {
		t.Errorf("otherNetns(pid 0 peer, namespace unknown) = %v, %v; want true and an error (not an in-process caller)", other, err)
	}
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatalf("run /bin/true: %v", err)
	}
	if other, err := otherNetns(api.Owner{PID: int32(gone.Process.Pid), Netns: peerns.Process(gone.Process.Pid)}); !other || err == nil {
		t.Errorf("otherNetns(caller resolved after it was reaped) = %v, %v; want true and an error", other, err)
	}
	in := testenv.NetnsChild(t)
	ns := peerns.Process(in)
	if ns.Err != nil {
		t.Fatalf("resolve the child's network namespace: %v", ns.Err)
	}
	if other, err := otherNetns(api.Owner{PID: int32(in), Netns: ns}); !other || err != nil {
		t.Errorf("otherNetns(caller in a new network namespace) = %v, %v; want true, nil", other, err)
	}
	if other, err := otherNetns(api.Owner{PID: me, Netns: ns}); !other || err != nil {
		t.Errorf("otherNetns(caller resolved in a new network namespace, its pid now a host-namespace process) = %v, %v; want true, nil", other, err)
	}
}

// Start gives network "none" to a caller resolved at accept in another
// namespace though its pid now names a host-namespace process (this one's,
// as a reused pid would), and the host's to one resolved in the daemon's;
// the resolved namespace is not kept in the record.
func TestStartDecidesOnTheNamespaceResolvedAtAccept(t *testing.T) {
	tr := newTestReactor(t, nil)
	in := testenv.NetnsChild(t)
	reused := root
	reused.Netns = peerns.Process(in)
	for _, tc := range []struct {
		name    string
		caller  api.Owner
		network string
	}{
		{"resolved in the daemon's namespace", root, "host"},
		{"resolved in another namespace, pid reused", reused, "none"},
	} {
		rec, err := tr.Start(context.Background(), tc.caller, api.StartParams{Argv: []string{"true"}, Network: "host"})
		if err != nil {
			t.Fatalf("%s: Start = %v", tc.name, err)
		}
		if rec.Network != tc.network || rec.Owner.Netns != nil {
			t.Errorf("%s: record network %q, owner's namespace %+v; want %q, nil", tc.name, rec.Network, rec.Owner.Netns, tc.network)
		}
		tr.wait(rec.ID)
	}
}

// The daemon's own namespace is kept once read, and a failed read is not
// kept: the next call reads again (and until then callers fail closed).
func TestSelfNetnsKeepsOnlyASuccessfulRead(t *testing.T) {
	reads := 0
	results := []error{os.ErrPermission, nil, os.ErrNotExist}
	c := netnsCache{read: func() (uint64, error) {
		err := results[reads]
		reads++
		if err != nil {
			return 0, err
		}
		return 1, nil
	}}
	if ns, err := c.get(); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("get() after a failed read = %d, %v; want the read's error", ns, err)
	}
	for i := 0; i < 3; i++ {
		if ns, err := c.get(); ns != 1 || err != nil {
			t.Fatalf("get() #%d = %d, %v; want 1, nil (a failed read was kept)", i+2, ns, err)
		}
	}
	if reads != 2 {
		t.Errorf("read %d times, want 2 (once failing, once succeeding, then kept)", reads)
	}
}
