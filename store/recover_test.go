package store

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

func TestRecover(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		S, R, C, E, X := api.StateStarted, api.StateRunning, api.StateCanceling, api.StateExited, api.StateCleaned
		then := time.Now().Add(-time.Hour)
		for i, p := range []struct {
			id   string
			path []api.State
		}{
			{"started", []api.State{S}},
			{"running", []api.State{S, R}},
			{"canceling", []api.State{S, R, C}},
			{"exited", []api.State{S, R, E}},
			{"cleaned", []api.State{S, E, X}},
			{"stuck", []api.State{S, R}}, // its clean fails
		} {
			rec := newRecord(p.id, 1000, i, nil)
			rec.StartedAt = &rec.CreatedAt
			mustCreate(t, s, rec)
			for j := 1; j < len(p.path); j++ {
				rec.State = p.path[j]
				switch p.path[j] {
				case E:
					rec = finished(rec, nil)
				case X:
					rec = finished(rec, &then)
				}
				mustTransition(t, s, p.path[j-1], rec)
			}
		}

		now := time.Now()
		var cleaned []string
		n, err := Recover(s, testLogger(t), now, func(rec api.Record) error {
			if rec.State != api.StateExited {
				t.Errorf("clean(%s) called in state %s, want exited", rec.ID, rec.State)
			}
			cleaned = append(cleaned, rec.ID)
			if rec.ID == "stuck" {
				return errors.New("scope busy")
			}
			return nil
		})
		if err != nil || n != 4 {
			t.Errorf("Recover = %d, %v; want 4, nil", n, err)
		}
		slices.Sort(cleaned)
		if got, want := strings.Join(cleaned, ","), "canceling,exited,running,started,stuck"; got != want {
			t.Errorf("clean called for %s, want %s", got, want)
		}
		for _, tc := range []struct {
			id      string
			state   api.State
			outcome api.Outcome
		}{
			{"started", X, api.OutcomeLost},
			{"running", X, api.OutcomeLost},
			{"canceling", X, api.OutcomeLost},
			{"exited", X, api.OutcomeExited},
			{"cleaned", X, api.OutcomeExited},
			{"stuck", E, api.OutcomeLost},
		} {
			rec := mustGet(t, s, tc.id)
			if rec.State != tc.state || rec.Outcome == nil || *rec.Outcome != tc.outcome {
				t.Errorf("%s after Recover: state %s, outcome %v; want %s, %s", tc.id, rec.State, rec.Outcome, tc.state, tc.outcome)
			}
			if tc.outcome == api.OutcomeLost && (rec.Error == nil || *rec.Error != LostError || rec.ExitedAt == nil) {
				t.Errorf("%s after Recover: error %v, exited_at %v; want %q and a time", tc.id, rec.Error, rec.ExitedAt, LostError)
			}
		}
		if rec := mustGet(t, s, "cleaned"); !rec.CleanedAt.Equal(then) {
			t.Errorf("Recover touched an already cleaned record: cleaned_at %v, want %v", rec.CleanedAt, then)
		}
		got, _ := s.Unfinished()
		if ids(got) != "stuck" {
			t.Errorf("Unfinished after Recover = %q, want stuck (retried next start-up)", ids(got))
		}
	})
}

func TestStatus(t *testing.T) {
	if got := Status(NewMemory()); got != "memory" {
		t.Errorf("Status(memory) = %q, want memory", got)
	}
	s := openTemp(t, t.TempDir())
	if got := Status(s); got != "ok" {
		t.Errorf("Status(sqlite) = %q, want ok", got)
	}
	op := failingOp{make(chan error, 1)}
	s.enqueue(op)
	<-op.ch
	if got := Status(s); !strings.HasPrefix(got, "degraded: ") || !strings.Contains(got, "no_such_table") {
		t.Errorf("Status(sqlite after failed write) = %q, want degraded: <error>", got)
	}
}

// TestRecoverWhySeesTheStateFound: Why is given the record in the state it
// was found in, so it can tell one lost while starting from one lost while
// running (before, it saw the lost record, exited: corrald said "while the
// execution ran" of executions that had never run).
func TestRecoverWhySeesTheStateFound(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		started := newRecord("started", 1000, 0, nil)
		mustCreate(t, s, started)
		running := newRecord("running", 1000, 1, nil)
		running.StartedAt = &running.CreatedAt
		mustCreate(t, s, running)
		running.State = api.StateRunning
		mustTransition(t, s, api.StateStarted, running)
		why := func(rec api.Record) string { return "was " + rec.State.String() }
		if _, err := RecoverWith(s, testLogger(t), time.Now(), RecoverOptions{Why: why}, func(api.Record) error { return nil }); err != nil {
			t.Fatal(err)
		}
		for id, want := range map[string]string{"started": "was started", "running": "was running"} {
			rec, ok, err := s.Get(id)
			if err != nil || !ok {
				t.Fatalf("Get %s: %v %v", id, ok, err)
			}
			if got := ptrOr(rec.Error); got != want {
				t.Errorf("%s: error %q, want %q", id, got, want)
			}
		}
	})
}

// TestRecoverNeverRan: a record RecoverOptions.NeverRan accepts ends
// start_failed with Why's error; the others lost.
func TestRecoverNeverRan(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		for i, id := range []string{"never", "maybe"} {
			mustCreate(t, s, newRecord(id, 1000, i, nil))
		}
		opts := RecoverOptions{
			Why: func(rec api.Record) string {
				if rec.ID == "never" {
					return "nothing ran"
				}
				return "fate unknown"
			},
			NeverRan: func(rec api.Record) bool { return rec.ID == "never" },
		}
		if n, err := RecoverWith(s, testLogger(t), time.Now(), opts, func(api.Record) error { return nil }); err != nil || n != 2 {
			t.Fatalf("RecoverWith = %d, %v; want 2, nil", n, err)
		}
		for _, tc := range []struct {
			id, why string
			outcome api.Outcome
		}{{"never", "nothing ran", api.OutcomeStartFailed}, {"maybe", "fate unknown", api.OutcomeLost}} {
			rec := mustGet(t, s, tc.id)
			if rec.State != api.StateCleaned || rec.Outcome == nil || *rec.Outcome != tc.outcome || rec.Error == nil || *rec.Error != tc.why {
				t.Errorf("%s: state %s outcome %v error %v; want cleaned, %s, %q", tc.id, rec.State, rec.Outcome, rec.Error, tc.outcome, tc.why)
			}
		}
	})
}

func ptrOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
