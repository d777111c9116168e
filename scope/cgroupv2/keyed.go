package cgroupv2

import (
	"bytes"
	"strconv"
)

// Keyed returns the value of key in a flat-keyed file ("key value" per
// line) such as cgroup.events, cpu.stat or memory.events.
func Keyed(data []byte, key string) (int64, bool) {
	for line := range bytes.Lines(data) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}
