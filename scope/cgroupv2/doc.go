// Package cgroupv2 is corral's one view of the cgroup filesystem: finding
// the cgroup2 mount (and, on hybrid hosts, the v1 hierarchies next to it)
// and working one cgroup directory (Dir): read and write its interface
// files, kill it with cgroup.kill, tell whether it is empty from
// cgroup.events, signal every process in it, walk its child cgroups, read
// its counters, watch its event files and remove it.
//
// The cgroup backend, the systemd backend's unified hierarchy and corrald's
// start-up sweep of leftover cgroups all use it, so each rule (what "gone"
// means, how a kill reaches a fork in flight) is written once.
//
// Ownership: a Dir is a path, a plain value; its methods touch only kernel
// state, so any goroutine may call them. Which methods block is said on each.
package cgroupv2
