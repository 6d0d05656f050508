package index

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time consumed by the calling OS thread. On a
// shared machine, wall time per op includes time the benchmark spent
// waiting for a core; CPU time of the (locked) thread does not.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
