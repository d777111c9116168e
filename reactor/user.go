package reactor

import (
	"os/user"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
// only) the named user. Reads the user database (or, while it has not
// changed, the answer it gave before: users); call off the loop.
func resolveUser(caller api.Owner, name string) (runAs, error) {
	key := userKey{uid: caller.UID, gid: caller.GID, name: name}
	stamp := stampUserDB()
	if ra, ok := users.get(key, stamp, time.Now()); ok {
		return ra, nil
	}
	ra, err := lookupUser(caller, name)
	if err == nil {
		users.put(key, stamp, ra)
	}
	return ra, err
}

// The user database as resolveUser last read it. os/user reads
// /etc/passwd and all of /etc/group for each lookup (0.9-2.1% of corrald's
// CPU in perf of the (d) step, 8 clients looping /bin/true), though they
// rarely change: an answer is kept while both files are as they were
// (inode, size, mtime, ctime) and for at most userCacheTTL, which bounds
// how late a change is seen where the database is more than these files
// (NSS, with a cgo build). Only answers are kept, never errors.
var users userCache

// userDBFiles are the files whose change drops every kept answer (a
// variable for tests).
var userDBFiles = [2]string{"/etc/passwd", "/etc/group"}

// userCacheTTL is the longest an answer is kept.
const userCacheTTL = time.Second

// userKey is what resolveUser's answer depends on besides the database.
type userKey struct {
	uid, gid uint32
	name     string
}

// fileStamp is what says a file changed; ok is false when it could not be
// read.
type fileStamp struct {
	ino, size, mtime, ctime int64
	ok                      bool
}

func stampUserDB() (s [2]fileStamp) {
	for i, path := range userDBFiles {
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil {
			s[i] = fileStamp{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ok: true}
		}
	}
	return s
}

// userCache keeps resolveUser's answers for one stamp of the database, for
// userCacheTTL from the first. Safe for concurrent use.
type userCache struct {
	mu    sync.Mutex
	stamp [2]fileStamp
	since time.Time
	m     map[userKey]runAs
}

// get returns the kept answer for key, if the database still has stamp
// and the answers are younger than userCacheTTL; otherwise it drops them.
func (c *userCache) get(key userKey, stamp [2]fileStamp, now time.Time) (runAs, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stamp != stamp || now.Sub(c.since) >= userCacheTTL {
		c.stamp, c.since, c.m = stamp, now, nil
		return runAs{}, false
	}
	ra, ok := c.m[key]
	ra.groups = slices.Clone(ra.groups)
	return ra, ok
}

// put keeps ra for key if the answers kept are for stamp (read before the
// lookup that gave ra).
func (c *userCache) put(key userKey, stamp [2]fileStamp, ra runAs) {
	if !stamp[0].ok || !stamp[1].ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stamp != stamp {
		return
	}
	if c.m == nil {
		c.m = make(map[userKey]runAs)
	}
	ra.groups = slices.Clone(ra.groups)
	c.m[key] = ra
}

// lookupUser is resolveUser's lookup in the user database.
func lookupUser(caller api.Owner, name string) (runAs, error) {
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
