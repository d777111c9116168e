package cgroupv2

import "testing"

const hybridMountinfo = `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime shared:9 master:1 - cgroup2 cgroup2 rw
`

const v2Mountinfo = `25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
90 25 0:22 /user.slice /mnt/my\040cg rw - cgroup2 cgroup2 rw
`

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name      string
		info      string
		mode      string
		mount     string
		mountRoot string
	}{
		{"hybrid", hybridMountinfo, "hybrid", "/sys/fs/cgroup/unified", "/"},
		{"pure v2", v2Mountinfo, "v2", "/sys/fs/cgroup", "/"},
		{"v1 only", "31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "v1", "", ""},
		{"none", "22 1 0:21 / /sys rw - sysfs sysfs rw\nbroken line\n", "", "", ""},
		{"v2 elsewhere only", "90 25 0:22 / /cg rw - cgroup2 none rw\n", "v2", "/cg", "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mounts := ParseMountinfo([]byte(tc.info))
			if got := Mode(mounts); got != tc.mode {
				t.Errorf("Mode = %q, want %q", got, tc.mode)
			}
			m, ok := FindUnified(mounts)
			if m.Point != tc.mount || m.Root != tc.mountRoot || ok != (tc.mount != "") {
				t.Errorf("FindUnified = %+v, %v, want point %q root %q", m, ok, tc.mount, tc.mountRoot)
			}
		})
	}
	// Escaped mount points are decoded.
	mounts := ParseMountinfo([]byte(v2Mountinfo))
	if len(mounts) != 2 || mounts[1].Point != "/mnt/my cg" || mounts[1].Root != "/user.slice" {
		t.Errorf("ParseMountinfo = %+v, want second mount /mnt/my cg rooted at /user.slice", mounts)
	}
}

func TestMountDirOfOwnCgroup(t *testing.T) {
	tests := []struct {
		name    string
		mount   Mount
		cgroup  string // /proc/self/cgroup text
		want    string
		wantErr bool
	}{
		{"root", Mount{Root: "/", Point: "/sys/fs/cgroup/unified"}, "1:cpu:/\n0::/\n", "/sys/fs/cgroup/unified", false},
		{"service", Mount{Root: "/", Point: "/sys/fs/cgroup"}, "0::/system.slice/corrald.service\n", "/sys/fs/cgroup/system.slice/corrald.service", false},
		{"subtree mount", Mount{Root: "/user.slice", Point: "/mnt/cg"}, "0::/user.slice/a.scope\n", "/mnt/cg/a.scope", false},
		{"outside subtree mount", Mount{Root: "/user.slice", Point: "/mnt/cg"}, "0::/user.slicex/a\n", "", true},
		{"outside namespace", Mount{Root: "/", Point: "/sys/fs/cgroup"}, "0::/../../x\n", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			own, ok := ParseOwn([]byte(tc.cgroup))
			if !ok {
				t.Fatalf("ParseOwn(%q) found no 0:: line", tc.cgroup)
			}
			got, err := tc.mount.Dir(own)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("%+v.Dir(%q) = %q, %v, want %q, error %v", tc.mount, own, got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, ok := ParseOwn([]byte("1:cpu:/\n")); ok {
		t.Errorf("ParseOwn of a v1-only file found a 0:: line")
	}
}

// TestMountDir maps systemd ControlGroup paths into v1 and v2 mounts, as
// the systemd backend does for every hierarchy.
func TestMountDir(t *testing.T) {
	tests := []struct {
		m    Mount
		cg   string
		want string // "" means an error
	}{
		{Mount{Point: "/sys/fs/cgroup", Root: "/"}, "/corral.slice/corral-x.scope", "/sys/fs/cgroup/corral.slice/corral-x.scope"},
		{Mount{Point: "/sys/fs/cgroup/memory", Root: "/"}, "corral.slice/corral-x.scope", "/sys/fs/cgroup/memory/corral.slice/corral-x.scope"},
		{Mount{Point: "/mnt/cg", Root: "/outer"}, "/outer/corral.slice/a.scope", "/mnt/cg/corral.slice/a.scope"},
		{Mount{Point: "/mnt/cg", Root: "/outer"}, "/outerx/a.scope", ""}, // not below the mount's root
		{Mount{Point: "/mnt/cg", Root: "/outer"}, "/other/a.scope", ""},
		{Mount{}, "/corral.slice/a.scope", ""},
	}
	for _, tt := range tests {
		got, err := tt.m.Dir(tt.cg)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("%+v.Dir(%q) = %q, %v, want %q", tt.m, tt.cg, got, err, tt.want)
		}
	}
}

// TestUnescapeMount: mountinfo's octal escapes are undone; a cut-off one
// is left as it is.
func TestUnescapeMount(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/sys/fs/cgroup", "/sys/fs/cgroup"},
		{`/mnt/a\040b`, "/mnt/a b"},
		{`/x\011y\134z`, "/x\ty\\z"},
		{`/trailing\04`, `/trailing\04`},
	}
	for _, tt := range tests {
		if got := unescapeMount(tt.in); got != tt.want {
			t.Errorf("unescapeMount(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
