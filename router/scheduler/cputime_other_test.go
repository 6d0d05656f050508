//go:build !linux

package scheduler

func threadCPU() int64 { return 0 }
func lockThread()      {}
func unlockThread()    {}
