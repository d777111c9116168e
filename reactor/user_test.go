package reactor

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// TestResolveUserKept: resolveUser answers as the lookup in the user
// database does, the second time from what it kept; a change of either
// file (here stand-ins for /etc/passwd and /etc/group) or userCacheTTL
// drops what it kept, and a caller changing the groups it got changes
// nothing kept.
func TestResolveUserKept(t *testing.T) {
	dir := t.TempDir()
	files := [2]string{filepath.Join(dir, "passwd"), filepath.Join(dir, "group")}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	saved := userDBFiles
	userDBFiles = files
	users = userCache{}
	t.Cleanup(func() { userDBFiles, users = saved, userCache{} })

	type ask struct {
		caller api.Owner
		name   string
	}
	for _, a := range []ask{
		{api.Owner{UID: 0, GID: 0}, ""},
		{api.Owner{UID: 65534, GID: 65534}, ""},
		{api.Owner{UID: 54321, GID: 54321}, ""}, // no passwd entry
		{api.Owner{UID: 0, GID: 0}, "nobody"},
	} {
		want, werr := lookupUser(a.caller, a.name)
		for i := 0; i < 2; i++ {
			got, err := resolveUser(a.caller, a.name)
			if (err != nil) != (werr != nil) || !reflect.DeepEqual(got, want) {
				t.Errorf("resolveUser(%v, %q) #%d = %+v, %v; the lookup says %+v, %v", a.caller, a.name, i+1, got, err, want, werr)
			}
		}
		if _, ok := users.m[userKey{a.caller.UID, a.caller.GID, a.name}]; !ok && werr == nil {
			t.Errorf("resolveUser(%v, %q) kept no answer", a.caller, a.name)
		}
	}
	root := userKey{0, 0, ""}
	got, _ := resolveUser(api.Owner{}, "")
	got.groups = append(got.groups[:0], 4242)
	if again, _ := resolveUser(api.Owner{}, ""); reflect.DeepEqual(again.groups, got.groups) && len(got.groups) > 0 {
		t.Errorf("a caller's change of the groups it got reached the kept answer: %v", again.groups)
	}
	// Older than userCacheTTL: dropped.
	if _, ok := users.get(root, stampUserDB(), users.since.Add(userCacheTTL)); ok {
		t.Error("an answer older than userCacheTTL was kept")
	}
	for i, f := range files {
		if _, err := resolveUser(api.Owner{}, ""); err != nil {
			t.Fatal(err)
		}
		if _, ok := users.m[root]; !ok {
			t.Fatalf("no answer kept for root")
		}
		time.Sleep(10 * time.Millisecond) // a later mtime, whatever the clock's grain
		if err := os.WriteFile(f, []byte("changed\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, ok := users.get(root, stampUserDB(), time.Now()); ok {
			t.Errorf("the answers were kept after %s (file %d) changed", f, i)
		}
	}
}
