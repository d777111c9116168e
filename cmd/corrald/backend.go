package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/scope/cgroupv2"
)

// chooseBackend picks the scope backend: under --scope auto, systemd when it
// is the service manager, else cgroup v2 when a writable cgroup2 hierarchy
// exists, else process groups.
func chooseBackend(ctx context.Context, c *config, host scope.Host, log zerolog.Logger) (scope.Backend, error) {
	tryCgroup := func() (scope.Backend, error) {
		return scope.NewCgroup(scope.CgroupOptions{Base: c.cgroupBase, Log: log})
	}
	trySystemd := func() (scope.Backend, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return scope.NewSystemd(cctx, scope.SystemdOptions{Slice: c.slice, Log: log})
	}
	switch c.scope {
	case "systemd":
		return trySystemd()
	case "cgroup":
		return tryCgroup()
	case "pgroup":
		return scope.NewPgroup(), nil
	case "auto":
		if host.SystemdPID1 {
			b, err := trySystemd()
			if err == nil {
				return b, nil
			}
			log.Warn().Err(err).Msg("systemd backend unavailable; trying cgroup v2")
		}
		if host.Cgroup2Mount != "" {
			b, err := tryCgroup()
			if err == nil {
				return b, nil
			}
			log.Warn().Err(err).Msg("cgroup backend unavailable; falling back to process groups (descendants that setsid can escape)")
		}
		return scope.NewPgroup(), nil
	}
	return nil, fmt.Errorf("--scope %q: want auto, systemd, cgroup or pgroup", c.scope)
}

// killLeftoverCgroup kills and removes a cgroup v2 scope left by an earlier
// run under a cgroup base other than this run's (the leftover cleaner covers
// its own base and every corral-*.scope unit), waiting up to 5s for it to
// empty. scope is the record's cgroup path relative to the cgroup2 root;
// other scope kinds are left to the leftover cleaner.
func killLeftoverCgroup(host scope.Host, name string) error {
	if !strings.HasPrefix(name, "/") || host.Cgroup2Mount == "" || strings.Contains(name, "..") {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cgroupv2.Dir(filepath.Join(host.Cgroup2Mount, name)).Destroy(ctx); err != nil {
		return fmt.Errorf("remove leftover cgroup %s: %w", name, err)
	}
	return nil
}

// poolSize resolves --pool-size -1. Under a backend that places a child
// only after it started (PlaceHeld: systemd) every command starts in a
// shim held until its scope exists, a D-Bus round trip and a job: 4
// shims wait. Under the cgroup and pgroup backends only a non-root
// caller's command or one with network "none" needs the shim (a root
// caller's host-network command is exec'd directly, pool or not), and a
// pooled shim saves that shim's start-up, about two thirds of such a
// start (docs/benchmarks.md, (a)): 2 wait.
func poolSize(flag int, b scope.Backend) int {
	if flag >= 0 {
		return flag
	}
	if b.Placement() == scope.PlaceHeld {
		return 4
	}
	return 2
}
