package micro

import (
	"bufio"
	"os"
	"runtime"
	"strings"
	"time"
)

// Machine describes where benchmarks ran.
type Machine struct {
	CPU       string    `json:"cpu"`
	Cores     int       `json:"cores"` // logical CPUs usable by this process
	GoVersion string    `json:"go_version"`
	OS        string    `json:"os"`
	Date      time.Time `json:"date"`
	Note      string    `json:"note,omitempty"`
}

// ThisMachine reads the CPU model from /proc/cpuinfo (falling back to the
// benchmark output's "cpu:" line, then to GOARCH).
func ThisMachine(fallbackCPU string) Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, Date: time.Now()}
	m.CPU = cpuModel("/proc/cpuinfo")
	if m.CPU == "" {
		m.CPU = fallbackCPU
	}
	if m.CPU == "" {
		m.CPU = runtime.GOARCH
	}
	return m
}

func cpuModel(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name", "Model", "cpu model", "Processor":
			if v = strings.TrimSpace(v); v != "" {
				return v
			}
		}
	}
	return ""
}
