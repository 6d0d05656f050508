package host

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// MemoryLimit returns the memory this process may use, in bytes: the
// lowest of the Go runtime's soft limit (GOMEMLIMIT, when set), the cgroup
// limit (v2 /sys/fs/cgroup/memory.max, else v1
// /sys/fs/cgroup/memory/memory.limit_in_bytes) and the machine's memory
// (MemTotal in /proc/meminfo); 0 when none can be read. The default index
// budget is a fraction of it (IndexLimits.MaxBytes).
func MemoryLimit() int64 {
	return memoryLimit(os.ReadFile, debug.SetMemoryLimit(-1))
}

// memoryLimit is MemoryLimit over a file reader and the runtime's limit
// (math.MaxInt64 = none), for tests.
func memoryLimit(read func(string) ([]byte, error), goLimit int64) int64 {
	var lim int64
	take := func(v int64) {
		if v > 0 && (lim == 0 || v < lim) {
			lim = v
		}
	}
	if goLimit != math.MaxInt64 {
		take(goLimit)
	}
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if b, err := read(p); err == nil {
			// "max" (v2) or a huge number (v1) means no limit: not
			// parsed, or above the machine's memory and ignored by take.
			if v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil {
				take(v)
			}
		}
	}
	if b, err := read("/proc/meminfo"); err == nil {
		take(memTotal(b))
	}
	return lim
}

// memTotal reads "MemTotal: <n> kB" from /proc/meminfo's text (0 when
// absent or unreadable).
func memTotal(meminfo []byte) int64 {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb <= 0 || kb > math.MaxInt64/1024 {
			return 0
		}
		return kb * 1024
	}
	return 0
}
