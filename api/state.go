package api

import (
	"encoding/json"
	"fmt"
)

// State is an execution's lifecycle state. States only move forward:
//
//	started -> running -> (canceling ->) exited -> cleaned
//
// started also moves straight to exited when the child could not be started.
// cleaned is terminal. The moves allowed are the table below (CanMoveTo),
// the one definition the reactor and the store both use.
type State int

const (
	StateStarted   State = iota + 1 // record written, child being spawned; next: running, exited
	StateRunning                    // main process alive and watched; next: canceling, exited
	StateCanceling                  // SIGTERM sent (timeout, cancel or limit); next: exited
	StateExited                     // main process reaped (the one Wait); next: cleaned
	StateCleaned                    // tree gone, scope removed, fds closed; terminal
)

// successors is the transition table: for each state, the states it may
// move to. It is the only copy; everything else asks CanMoveTo.
var successors = map[State][]State{
	StateStarted:   {StateRunning, StateExited},
	StateRunning:   {StateCanceling, StateExited},
	StateCanceling: {StateExited},
	StateExited:    {StateCleaned},
	StateCleaned:   nil, // terminal
}

// CanMoveTo reports whether the lifecycle allows a move from s to next.
// A state never moves to itself, and an unknown state moves nowhere.
func (s State) CanMoveTo(next State) bool {
	for _, t := range successors[s] {
		if t == next {
			return true
		}
	}
	return false
}

// Successors returns the states s may move to, in lifecycle order.
func (s State) Successors() []State {
	return append([]State(nil), successors[s]...)
}

// Valid reports whether s is one of the five states.
func (s State) Valid() bool {
	_, ok := successors[s]
	return ok
}

var stateNames = map[State]string{
	StateStarted:   "started",
	StateRunning:   "running",
	StateCanceling: "canceling",
	StateExited:    "exited",
	StateCleaned:   "cleaned",
}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// ParseState returns the State named s.
func ParseState(s string) (State, error) {
	for k, v := range stateNames {
		if v == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown state %q", s)
}

// Terminal reports whether no transition leaves s.
func (s State) Terminal() bool { return s.Valid() && len(successors[s]) == 0 }

// Finished reports whether the main process has been reaped.
func (s State) Finished() bool { return s >= StateExited }

func (s State) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

func (s *State) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return err
	}
	v, err := ParseState(str)
	if err != nil {
		return err
	}
	*s = v
	return nil
}
