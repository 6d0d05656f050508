//go:build !linux

package index

import "time"

func threadCPU() time.Duration { return 0 }
