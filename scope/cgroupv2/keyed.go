package cgroupv2

import (
	"bytes"
	"strconv"
)

// Keyed returns the value of key in a flat-keyed file ("key value" per
// line) such as cgroup.events, cpu.stat or memory.events. It does not keep
// data (a caller's buffer on the stack stays there).
func Keyed(data []byte, key string) (int64, bool) {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
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
