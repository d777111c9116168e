package scope

// Host describes the facts about this machine that decide which scope
// backend can run; daemon.info reports them. Detect fills it once; it is a
// plain value owned by whoever holds it.
type Host struct {
	// CgroupMode is "v2" (only cgroup2, at /sys/fs/cgroup), "hybrid" (v1
	// controller hierarchies plus a cgroup2 mount, usually
	// /sys/fs/cgroup/unified), "v1" (no cgroup2 mount) or "" (no cgroup
	// filesystem mounted).
	CgroupMode string `json:"cgroup_mode"`
	// Cgroup2Mount is where the cgroup2 hierarchy is mounted, "" if nowhere.
	Cgroup2Mount string `json:"cgroup2_mount,omitempty"`
	// OwnCgroup is this process's cgroup v2 path from /proc/self/cgroup
	// ("0::" line), relative to the cgroup2 root; "" if unknown.
	OwnCgroup string `json:"own_cgroup,omitempty"`
	// Kernel is the kernel release (uname -r).
	Kernel string `json:"kernel"`
	// Pidfd reports whether pidfd_open(2) works on this kernel.
	Pidfd bool `json:"pidfd"`
	// SystemdPID1 reports whether systemd runs as PID 1
	// (/run/systemd/system exists, as sd_booted(3) checks).
	SystemdPID1 bool `json:"systemd_pid1"`
}
