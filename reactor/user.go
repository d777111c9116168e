package reactor

import (
	"os/user"
	"strconv"

	"github.com/corral-dev/corral/api"
)

// runAs is the identity a child runs with.
type runAs struct {
	uid, gid uint32
	groups   []uint32
	name     string
	home     string
}

// resolveUser decides who the child runs as: the caller, or (root callers
// only) the named user. Reads the user database; call off the loop.
func resolveUser(caller api.Owner, name string) (runAs, error) {
	var u *user.User
	var err error
	if name != "" {
		if caller.UID != 0 {
			if cu, cerr := user.LookupId(strconv.Itoa(int(caller.UID))); cerr != nil || cu.Username != name {
				return runAs{}, api.Errorf(api.CodePermission, "user: only root may run commands as another user")
			}
		}
		if u, err = user.Lookup(name); err != nil {
			if u, err = user.LookupId(name); err != nil {
				return runAs{}, api.Errorf(api.CodeInvalidParams, "user: unknown user %q", name)
			}
		}
	} else if u, err = user.LookupId(strconv.Itoa(int(caller.UID))); err != nil {
		// A uid without a passwd entry runs with its own gid and no groups.
		return runAs{uid: caller.UID, gid: caller.GID, name: strconv.Itoa(int(caller.UID)), home: "/"}, nil
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	ra := runAs{uid: uint32(uid), gid: uint32(gid), name: u.Username, home: u.HomeDir}
	if name == "" {
		ra.gid = caller.GID
	}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				ra.groups = append(ra.groups, uint32(n))
			}
		}
	}
	return ra, nil
}
