package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/corral-dev/corral/api"
)

// fakeKept serves exec.output as corrald's kept output does: the first
// headLen bytes and the last tailLen bytes of data, the middle dropped
// (a read in the head stops at its end; an offset in the middle jumps to the
// tail with gap set).
type fakeKept struct {
	data             []byte
	headLen, tailLen int
	eof              bool
}

func (f *fakeKept) read(_ context.Context, p api.OutputParams) (api.OutputResult, error) {
	total := int64(len(f.data))
	res := api.OutputResult{TotalBytes: total}
	off, limit := p.Offset, p.Limit
	if limit == 0 {
		limit = 1 << 30
	}
	head := int64(f.headLen)
	tailOff := total - int64(f.tailLen)
	if f.headLen+f.tailLen == 0 || f.headLen+f.tailLen >= len(f.data) {
		head, tailOff = total, total
	}
	switch {
	case off >= total:
		res.Offset, res.NextOffset = total, total
	case off < head:
		end := min(head, off+limit)
		res.Data, res.Offset, res.NextOffset = f.data[off:end], off, end
	default:
		if off < tailOff {
			off, res.Gap = tailOff, true
		}
		end := min(total, off+limit)
		res.Data, res.Offset, res.NextOffset = f.data[off:end], off, end
	}
	res.EOF = f.eof && res.NextOffset >= total
	return res, nil
}

func TestReadBudgeted(t *testing.T) {
	euro := strings.Repeat("€", 1000) // 3000 bytes, 3 per character
	tests := []struct {
		name     string
		kept     fakeKept
		from     int64
		budget   int64
		want     string // exact text, or "" to check only the properties below
		contains []string
		next     int64
	}{
		{name: "fits", kept: fakeKept{data: []byte("hello\n"), eof: true}, budget: 100, want: "hello\n", next: 6},
		{name: "from offset", kept: fakeKept{data: []byte("hello\nworld\n"), eof: true}, from: 6, budget: 100, want: "world\n", next: 12},
		{name: "head and tail", kept: fakeKept{data: []byte(strings.Repeat("a", 100) + strings.Repeat("b", 100)), eof: true},
			budget: 64, want: strings.Repeat("a", 32) + "\n[... 136 bytes omitted ...]\n" + strings.Repeat("b", 32), next: 200},
		{name: "cut only between characters", kept: fakeKept{data: []byte(euro), eof: true}, budget: 100,
			// 50 bytes of head hold 16 characters (48 bytes), 50 of tail 16 too.
			want: strings.Repeat("€", 16) + "\n[... 2904 bytes omitted ...]\n" + strings.Repeat("€", 16), next: 3000},
		{name: "daemon dropped the middle", kept: fakeKept{data: []byte(strings.Repeat("x", 50) + strings.Repeat("y", 50)), headLen: 10, tailLen: 10, eof: true},
			budget: 1000, want: strings.Repeat("x", 10) + "\n[... 80 bytes omitted ...]\n" + strings.Repeat("y", 10), next: 100},
		{name: "offset in the daemon's dropped middle", kept: fakeKept{data: []byte(strings.Repeat("x", 50) + strings.Repeat("y", 50)), headLen: 10, tailLen: 10, eof: true},
			from: 30, budget: 1000, want: "[... 60 bytes omitted ...]\n" + strings.Repeat("y", 10), next: 100},
		{name: "partial character at the end of a running stream waits", kept: fakeKept{data: []byte("ab\xe2\x82")},
			budget: 100, want: "ab", next: 2},
		{name: "partial character at the end of an ended stream is shown escaped", kept: fakeKept{data: []byte("ab\xe2\x82"), eof: true},
			budget: 100, want: `ab\xe2\x82`, next: 4},
		{name: "control bytes escaped", kept: fakeKept{data: []byte("a\x00b\x07c\r\nd\te\x1b[1m"), eof: true},
			budget: 100, want: "a\\x00b\\x07c\nd\te\x1b[1m", next: 14},
		{name: "binary summarised", kept: fakeKept{data: []byte("\x00\x01\x02\x03\xff\xfe\xfd\xfc\x00\x01\x02\x03\xff\xfe\xfd\xfc\x00"), eof: true},
			budget: 100, contains: []string{"[binary output: 17 bytes", "00 01 02 03 ff fe"}, next: 17},
		{name: "empty", kept: fakeKept{eof: true}, budget: 100, want: "", next: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readBudgeted(context.Background(), tt.kept.read, "id", "stdout", tt.from, tt.budget)
			if err != nil {
				t.Fatal(err)
			}
			if tt.contains == nil && got.text != tt.want {
				t.Errorf("text = %q, want %q", got.text, tt.want)
			}
			for _, c := range tt.contains {
				if !strings.Contains(got.text, c) {
					t.Errorf("text = %q, want it to contain %q", got.text, c)
				}
			}
			if !utf8.ValidString(got.text) {
				t.Errorf("text %q is not valid UTF-8", got.text)
			}
			if got.next != tt.next {
				t.Errorf("next = %d, want %d", got.next, tt.next)
			}
		})
	}
}

// TestReadBudgetedStaysWithinBudget: whatever the budget and the text, the
// shown bytes (markers aside) never exceed the budget and never split a
// character.
func TestReadBudgetedStaysWithinBudget(t *testing.T) {
	data := []byte(strings.Repeat("añ€𝄞\n", 500))
	for budget := int64(64); budget < 600; budget += 37 {
		k := fakeKept{data: data, eof: true}
		got, err := readBudgeted(context.Background(), k.read, "id", "stdout", 0, budget)
		if err != nil {
			t.Fatal(err)
		}
		shown := marker.ReplaceAllString(got.text, "")
		if int64(len(shown)) > budget {
			t.Errorf("budget %d: %d bytes shown", budget, len(shown))
		}
		if !utf8.ValidString(got.text) || strings.ContainsRune(got.text, utf8.RuneError) {
			t.Errorf("budget %d: text has a broken character: %q", budget, got.text)
		}
	}
}

var marker = regexp.MustCompile(`\n?\[\.\.\. \d+ bytes omitted \.\.\.\]\n`)

func TestSplitBudget(t *testing.T) {
	tests := []struct {
		budget, out, err, wantOut, wantErr int64
	}{
		{1000, 10, 10, 990, 990},
		{1000, 5000, 0, 1000, 64},
		{1000, 5000, 5000, 500, 500},
		{1000, 5000, 100, 900, 100},
		{1000, 100, 5000, 100, 900},
	}
	for _, tt := range tests {
		o, e := splitBudget(tt.budget, tt.out, tt.err)
		if o != tt.wantOut || e != tt.wantErr {
			t.Errorf("splitBudget(%d, %d, %d) = %d, %d, want %d, %d", tt.budget, tt.out, tt.err, o, e, tt.wantOut, tt.wantErr)
		}
	}
}

func TestCommandArgv(t *testing.T) {
	tests := []struct {
		name    string
		in      execCommandIn
		want    []string
		wantErr string
	}{
		{name: "cmd", in: execCommandIn{Cmd: "ls -l"}, want: []string{"/bin/sh", "-c", "ls -l"}},
		{name: "argv", in: execCommandIn{Argv: []string{"ls", "-l"}}, want: []string{"ls", "-l"}},
		{name: "neither", in: execCommandIn{}, wantErr: "missing command"},
		{name: "both", in: execCommandIn{Cmd: "x", Argv: []string{"y"}}, wantErr: "not both"},
		{name: "huge cmd", in: execCommandIn{Cmd: strings.Repeat("x", 200000)}, wantErr: "cmd is 200000 bytes"},
		{name: "NUL", in: execCommandIn{Argv: []string{"a\x00b"}}, wantErr: "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := commandArgv(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("commandArgv() error = %v, want it to say %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || strings.Join(got, "\x00") != strings.Join(tt.want, "\x00") {
				t.Errorf("commandArgv() = %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}
