package bench

import (
	"strings"
	"testing"
	"time"
)

// slowTable puts the slowest samples' time in the part that holds it: of
// 20 samples, one is slow by 10 ms, all of it in the second part.
func TestSlowTableFindsThePart(t *testing.T) {
	var total, a, b durations
	for i := range 20 {
		x, y := time.Millisecond, time.Millisecond
		if i == 7 {
			y += 10 * time.Millisecond
		}
		a, b, total = append(a, x), append(b, y), append(total, x+y)
	}
	s := &suite{t: t}
	s.slowTable("the test side", total, []durations{a, b}, []string{"first", "second"})
	out := s.out.String()
	for _, want := range []string{
		"slowest 1 of 20 samples of the test side",
		"| whole sample | 2.000 | 12.000 | 10.000 |",
		"| first | 1.000 | 1.000 | 0.000 |",
		"| second | 1.000 | 11.000 | 10.000 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("slowTable output lacks %q:\n%s", want, out)
		}
	}
	// Parts not paired with every sample: no table rather than a wrong one.
	s.out.Reset()
	s.slowTable("unpaired", total, []durations{a[:3]}, []string{"first"})
	if s.out.Len() != 0 {
		t.Errorf("slowTable printed for unpaired parts:\n%s", s.out.String())
	}
}
