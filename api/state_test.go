package api

import (
	"errors"
	"fmt"
	"testing"
)

func TestCanMoveTo(t *testing.T) {
	S, R, C, E, X := StateStarted, StateRunning, StateCanceling, StateExited, StateCleaned
	legal := map[[2]State]bool{
		{S, R}: true, {S, E}: true,
		{R, C}: true, {R, E}: true,
		{C, E}: true,
		{E, X}: true,
	}
	all := []State{0, S, R, C, E, X, 99}
	for _, from := range all {
		for _, to := range all {
			want := legal[[2]State{from, to}]
			if got := from.CanMoveTo(to); got != want {
				t.Errorf("%s.CanMoveTo(%s) = %v, want %v", from, to, got, want)
			}
		}
	}
	for _, tt := range []struct {
		s             State
		terminal, fin bool
		valid         bool
	}{
		{S, false, false, true}, {R, false, false, true}, {C, false, false, true},
		{E, false, true, true}, {X, true, true, true}, {0, false, false, false},
	} {
		if got := tt.s.Terminal(); got != tt.terminal {
			t.Errorf("%s.Terminal() = %v, want %v", tt.s, got, tt.terminal)
		}
		if got := tt.s.Finished(); got != tt.fin {
			t.Errorf("%s.Finished() = %v, want %v", tt.s, got, tt.fin)
		}
		if got := tt.s.Valid(); got != tt.valid {
			t.Errorf("%s.Valid() = %v, want %v", tt.s, got, tt.valid)
		}
	}
	// Successors hands out a copy: the table cannot be changed through it.
	next := S.Successors()
	next[0] = X
	if !S.CanMoveTo(R) || S.CanMoveTo(X) {
		t.Errorf("changing Successors() changed the table: started -> %v", S.Successors())
	}
}

func TestStateJSON(t *testing.T) {
	for _, s := range []State{StateStarted, StateRunning, StateCanceling, StateExited, StateCleaned} {
		b, err := s.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var back State
		if err := back.UnmarshalJSON(b); err != nil || back != s {
			t.Errorf("UnmarshalJSON(%s) = %v, %v; want %v", b, back, err, s)
		}
	}
	var s State
	if err := s.UnmarshalJSON([]byte(`"pending"`)); err == nil {
		t.Errorf("UnmarshalJSON(\"pending\") = %v, nil; want an error", s)
	}
}

func TestSentinel(t *testing.T) {
	wrapped := fmt.Errorf("lookup: %w", ErrNotFound)
	if !errors.Is(wrapped, ErrNotFound) {
		t.Errorf("errors.Is(%v, ErrNotFound) = false, want true", wrapped)
	}
	if got := ErrorCode(wrapped); got != CodeNotFound {
		t.Errorf("ErrorCode(%v) = %d, want %d", wrapped, got, CodeNotFound)
	}
	var e *Error
	if !errors.As(wrapped, &e) || e.Code != CodeNotFound || e.Message != "execution not found" {
		t.Fatalf("errors.As(%v, *Error) = %+v, want code %d and the sentinel's message", wrapped, e, CodeNotFound)
	}
	// The *Error errors.As gives is a copy: changing it changes no one else's.
	e.Message = "changed"
	if ErrNotFound.Error() != "execution not found" {
		t.Errorf("ErrNotFound.Error() = %q after changing a copy", ErrNotFound.Error())
	}
	// What a client rebuilds from the wire matches the sentinel by code.
	fromWire := &Error{Code: CodeNotFound, Message: "execution not found"}
	if !errors.Is(fromWire, ErrNotFound) {
		t.Errorf("errors.Is(wire error, ErrNotFound) = false, want true")
	}
	if errors.Is(&Error{Code: CodePermission, Message: "no"}, ErrNotFound) {
		t.Errorf("errors.Is(permission error, ErrNotFound) = true, want false")
	}
}
