package main

import (
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// TestInfoShowsSurvival: corralctl info says what survives a reload and a
// crash on this host.
func TestInfoShowsSurvival(t *testing.T) {
	for _, tc := range []struct {
		sv    api.SurvivalInfo
		crash string
	}{
		{api.SurvivalInfo{Handover: true, FdStore: true, PidfdExitInfo: true}, "Survives a crash:  yes (fd store)\n"},
		{api.SurvivalInfo{Handover: true, FdStore: true}, "no PIDFD_INFO_EXIT"},
		{api.SurvivalInfo{Handover: true, PidfdExitInfo: true}, "Survives a crash:  no: no fd store"},
	} {
		var b strings.Builder
		sv := tc.sv
		if err := writeInfo(&b, api.Info{Survival: &sv, Adopted: 3, StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if !strings.Contains(out, "Survives a reload: yes (handover)\n") || !strings.Contains(out, tc.crash) ||
			!strings.Contains(out, "(adopted 3 running executions)") {
			t.Errorf("info for %+v:\n%s\nwant the reload line, %q and the adopted count", tc.sv, out, tc.crash)
		}
	}
}
