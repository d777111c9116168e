package drill

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// Row is one fault's line of the drill report.
type Row struct {
	Fault string
	// Note says how the fault was applied and what the daemon reported it
	// survives (which decides whether lost is expected).
	Note string
	// Started: executions whose exec.start was answered with a record (or
	// whose record exists although the answer was lost). Finished: of
	// those, cleaned. Refused: exec.start answered with an error.
	Started, Finished, Refused int
	// Wrong: executions (and checks) whose result is not what happened.
	Wrong int
	// LostOutcomes: executions that ended lost; UnexpectedLost those the
	// daemon claims to survive (also counted in Wrong).
	LostOutcomes, UnexpectedLost int
	// LostRecords: started executions without a record afterwards.
	LostRecords int
	// LostBytes: bytes the child wrote that the kept output misses.
	LostBytes int64
	// Unchecked: executions whose output could not be compared (an
	// exec.write answer was lost).
	Unchecked int
	// Tolerated: executions whose outcome is not the mix's but one the
	// fault may cause (Checks.Tolerate).
	Tolerated int
	// NeverRan: executions still starting at a kill of corrald whose
	// command was never let run, ended start_failed with
	// reactor.StartFailedRestart (Exec.AllowNeverRan).
	NeverRan int
	// LostWhy counts the allowed lost ones (LostOutcomes less
	// UnexpectedLost) by their error: why each could not be kept.
	LostWhy   map[string]int `json:",omitempty"`
	Leftovers int
	// Exec latency (exec.start to cleaned of a quick command) before the
	// fault and from the fault until it was cleared; Samples* count them.
	P50Before, P99Before, P50During, P99During time.Duration
	SamplesBefore, SamplesDuring               int
	// Recovery: from the fault's end (the kill, for a kill) to the end of
	// the first quick execution started after it.
	Recovery    time.Duration
	InfoLatency time.Duration
	Problems    []string
	// WrongIDs are the executions counted in Wrong, for the daemon's log
	// lines about them (the test prints those; not in the report).
	WrongIDs []string `json:"-"`
	// Skipped says why a fault could not be applied on this host or
	// daemon (it is then reported, never silently dropped).
	Skipped string
}

// OK reports whether the row shows nothing wrong.
func (r Row) OK() bool {
	return r.Wrong == 0 && r.LostRecords == 0 && r.LostBytes == 0 && r.Leftovers == 0 && r.UnexpectedLost == 0
}

func (p *Phase) latency(row *Row) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var before, during []time.Duration
	var rec time.Time
	from := p.RecoverFrom
	if from.IsZero() {
		from = p.ClearedAt
	}
	for _, s := range p.samples {
		d := s.end.Sub(s.start)
		switch {
		case p.FaultAt.IsZero() || s.start.Before(p.FaultAt):
			before = append(before, d)
		case p.ClearedAt.IsZero() || !s.start.After(p.ClearedAt):
			during = append(during, d)
		}
		if !from.IsZero() && !s.start.Before(from) && (rec.IsZero() || s.end.Before(rec)) {
			rec = s.end
		}
	}
	row.P50Before, row.P99Before = quantile(before, 0.5), quantile(before, 0.99)
	row.P50During, row.P99During = quantile(during, 0.5), quantile(during, 0.99)
	row.SamplesBefore, row.SamplesDuring = len(before), len(during)
	if !rec.IsZero() {
		row.Recovery = rec.Sub(from)
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q * float64(len(s)-1))
	return s[i]
}

// Report is a drill run's rows and how it was run.
type Report struct {
	Title  string
	Header []string // lines describing the run: commit, clients, durations
	Rows   []Row
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%d", d.Milliseconds())
}

// Markdown renders the report.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", r.Title)
	for _, h := range r.Header {
		fmt.Fprintf(&b, "%s\n", h)
	}
	b.WriteString("\n| fault | started | finished | refused | wrong | lost (allowed) | lost records | lost bytes | leftovers | p50/p99 ms before | p50/p99 ms during | recovery ms | verdict |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		if row.Skipped != "" {
			fmt.Fprintf(&b, "| %s | - | - | - | - | - | - | - | - | - | - | - | not run: %s |\n", row.Fault, row.Skipped)
			continue
		}
		verdict := "ok"
		if !row.OK() {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d (%d) | %d | %d | %d | %s/%s (n=%d) | %s/%s (n=%d) | %s | %s |\n",
			row.Fault, row.Started, row.Finished, row.Refused, row.Wrong, row.LostOutcomes, row.LostOutcomes-row.UnexpectedLost,
			row.LostRecords, row.LostBytes, row.Leftovers,
			ms(row.P50Before), ms(row.P99Before), row.SamplesBefore, ms(row.P50During), ms(row.P99During), row.SamplesDuring,
			ms(row.Recovery), verdict)
	}
	b.WriteString("\n")
	for _, row := range r.Rows {
		if row.Note == "" && len(row.Problems) == 0 && row.Tolerated == 0 && row.NeverRan == 0 && len(row.LostWhy) == 0 {
			continue
		}
		fmt.Fprintf(&b, "- **%s**: %s\n", row.Fault, row.Note)
		whys := make([]string, 0, len(row.LostWhy))
		for why := range row.LostWhy {
			whys = append(whys, why)
		}
		sort.Strings(whys)
		for _, why := range whys {
			fmt.Fprintf(&b, "  - %d ended lost, as this fault allows: %q\n", row.LostWhy[why], why)
		}
		if row.NeverRan > 0 {
			fmt.Fprintf(&b, "  - %d executions still starting at the kill ended start_failed: their command was never let run (nothing ran)\n", row.NeverRan)
		}
		if row.Tolerated > 0 {
			fmt.Fprintf(&b, "  - %d executions ended with an outcome this fault may cause (see the note)\n", row.Tolerated)
		}
		if row.Unchecked > 0 {
			fmt.Fprintf(&b, "  - %d executions' output not compared: an exec.write answer was lost\n", row.Unchecked)
		}
		for i, p := range row.Problems {
			if i == 20 {
				fmt.Fprintf(&b, "  - ... and %d more\n", len(row.Problems)-20)
				break
			}
			fmt.Fprintf(&b, "  - %s\n", p)
		}
	}
	return b.String()
}

// Write writes the report as Markdown to path and its rows as JSON to
// path + ".json" (for `make drill` to assemble docs/drills.md).
func (r Report) Write(path string) error {
	if err := os.WriteFile(path, []byte(r.Markdown()), 0o644); err != nil {
		return fmt.Errorf("write drill report: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode drill report: %w", err)
	}
	if err := os.WriteFile(path+".json", b, 0o644); err != nil {
		return fmt.Errorf("write drill report: %w", err)
	}
	return nil
}
