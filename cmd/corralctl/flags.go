package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/cmd/internal/cli"
)

// parseSize parses a byte count: a non-negative integer with an optional
// K, M, G or T suffix (powers of 1024), optionally followed by "B" or "iB",
// case-insensitive: "512M", "1GiB", "100k", "4096".
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(u, "IB")
	u = strings.TrimSuffix(u, "B")
	mult := int64(1)
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			u = u[:n-1]
		}
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q (want a number with an optional K, M, G or T suffix)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}

// parseDuration parses a time.ParseDuration string ("30s", "1m30s"); a bare
// number is seconds, as for timeout(1). Negative durations are refused.
func parseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || f < 0 || f > math.MaxInt64/float64(time.Second) {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want e.g. 30s, 1m30s, 500ms)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid duration %q: negative", s)
	}
	return d, nil
}

// millis converts d to whole milliseconds, rounding a positive sub-millisecond
// duration up so that it does not become 0 (which means "default").
func millis(d time.Duration) int64 {
	ms := d.Milliseconds()
	if ms == 0 && d > 0 {
		return 1
	}
	return ms
}

// durationFlag is a pflag.Value holding a duration; set records whether the
// flag was given.
type durationFlag struct {
	d   time.Duration
	set bool
}

func (f *durationFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.d.String()
}

func (f *durationFlag) Type() string { return "duration" }

func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	f.d, f.set = d, true
	return nil
}

// sizeFlag is a pflag.Value holding a byte count.
type sizeFlag struct {
	n   int64
	set bool
}

func (f *sizeFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.FormatInt(f.n, 10)
}

func (f *sizeFlag) Type() string { return "size" }

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	f.n, f.set = n, true
	return nil
}

// kvFlag collects repeated KEY=VALUE flags. When lookup is set, a bare KEY
// takes its value from lookup (as docker run -e KEY does); otherwise a bare
// KEY is an error.
type kvFlag struct {
	m      map[string]string
	what   string
	lookup func(string) (string, bool)
}

func (f *kvFlag) String() string {
	if f == nil {
		return ""
	}
	parts := make([]string, 0, len(f.m))
	for k, v := range f.m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (f *kvFlag) Type() string { return "KEY=VALUE" }

func (f *kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if k == "" {
		return fmt.Errorf("invalid %s %q: want KEY=VALUE", f.what, s)
	}
	if !ok {
		if f.lookup == nil {
			return fmt.Errorf("invalid %s %q: want KEY=VALUE", f.what, s)
		}
		if v, ok = f.lookup(k); !ok {
			return fmt.Errorf("invalid %s %q: want KEY=VALUE (and %s is not set here)", f.what, s, k)
		}
	}
	if f.m == nil {
		f.m = make(map[string]string)
	}
	f.m[k] = v
	return nil
}

// globalFlags are accepted before the subcommand and by every subcommand.
type globalFlags struct {
	socket string
	json   bool
}

func (g *globalFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.socket, "socket", g.socket, "corrald socket `PATH` (default $CORRAL_SOCKET or /run/corral/corrald.sock)")
	fs.BoolVar(&g.json, "json", g.json, "print raw JSON records/results")
	cli.CompleteValues(fs, map[string]string{"socket": "file"})
}

// osLookup is os.LookupEnv; a var so that tests need not touch the
// environment.
var osLookup = os.LookupEnv

// countFlag is a pflag.Value holding a count that may not be negative, so
// that a negative one is refused as a flag error (with the pointer to
// --help) before anything is sent.
type countFlag struct {
	n int64
}

func (f *countFlag) String() string {
	if f == nil {
		return "0"
	}
	return strconv.FormatInt(f.n, 10)
}

func (f *countFlag) Type() string { return "int" }

func (f *countFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return errors.New("must be an integer")
	}
	if n < 0 {
		return errors.New("negative")
	}
	f.n = n
	return nil
}

// choiceFlag is a pflag.Value holding one of a fixed set of words ("" when
// not given); another word is refused naming the ones it takes.
type choiceFlag struct {
	v       string
	choices []string
}

func (f *choiceFlag) String() string {
	if f == nil {
		return ""
	}
	return f.v
}

func (f *choiceFlag) Type() string { return "string" }

func (f *choiceFlag) Set(s string) error {
	if s != "" && !slices.Contains(f.choices, s) {
		return fmt.Errorf("want %s", orList(f.choices))
	}
	f.v = s
	return nil
}

// orList is "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
