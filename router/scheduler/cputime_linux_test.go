package scheduler

import (
	"runtime"
	"syscall"
	"unsafe"
)

// threadCPU returns the calling thread's CPU time in ns
// (CLOCK_THREAD_CPUTIME_ID). Benchmarks report it next to wall time because
// the shared 2-core machine they run on time-slices between many processes:
// wall time then counts time the benchmark was not even running.
func threadCPU() int64 {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		return 0
	}
	return ts.Nano()
}

func lockThread()   { runtime.LockOSThread() }
func unlockThread() { runtime.UnlockOSThread() }
