package scenario

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// Process-wide resource measurements, for the scenarios whose figure is
// what the client costs rather than how fast it is (fragmented-frame,
// idle-connections). Each benchmark run is a process of its own, so the
// whole process's CPU time and RSS belong to the measurement; that is
// also what an operator sees in top.

// A procSample is the process's resource use at one instant.
type procSample struct {
	at    time.Time
	cpu   time.Duration // user + system CPU time since the process started
	nvcsw int64         // voluntary context switches: each is a sleep, so it counts wake-ups
}

// sampleProc reads the process's CPU time from getrusage(RUSAGE_SELF), as
// the reference measurements do (psutil's cpu_times for kombu, getrusage
// for upstream-baseline E). It covers every thread, the Go runtime's
// included, which is right: a reader that spins shows up wherever it runs.
func sampleProc() (procSample, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return procSample{}, fmt.Errorf("getrusage: %w", err)
	}
	return procSample{
		at:    time.Now(),
		cpu:   time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		nvcsw: int64(ru.Nvcsw),
	}, nil
}

// A procDelta is the resource use between two samples.
type procDelta struct {
	wall, cpu time.Duration
	nvcsw     int64
}

// since returns what the process used between earlier and s.
func (s procSample) since(earlier procSample) procDelta {
	return procDelta{wall: s.at.Sub(earlier.at), cpu: s.cpu - earlier.cpu, nvcsw: s.nvcsw - earlier.nvcsw}
}

// busy is the CPU busy ratio over the interval, in cores: CPU seconds per
// wall second. 0.005 is half a percent of one core.
func (d procDelta) busy() float64 {
	if d.wall <= 0 {
		return 0
	}
	return d.cpu.Seconds() / d.wall.Seconds()
}

// A memSample is the process's memory and goroutines at one instant, taken
// after a GC so that garbage does not count as cost.
type memSample struct {
	rss        int64 // VmRSS, bytes: what the kernel charges the process
	heapInuse  int64 // bytes in in-use heap spans
	stackInuse int64 // bytes of goroutine stacks
	goroutines int
}

// sampleMem collects garbage, then reads VmRSS from /proc/self/status and
// the runtime's own accounts. RSS includes what the runtime has not yet
// returned to the kernel, so per-connection RSS is a difference between
// two samples, never one sample divided by a count.
func sampleMem() (memSample, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := vmRSS()
	if err != nil {
		return memSample{}, err
	}
	return memSample{
		rss:        rss,
		heapInuse:  int64(ms.HeapInuse),
		stackInuse: int64(ms.StackInuse),
		goroutines: runtime.NumGoroutine(),
	}, nil
}

// vmRSS returns the VmRSS line of /proc/self/status in bytes.
func vmRSS() (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read RSS: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		// The line reads "VmRSS:	   12345 kB".
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:"))
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse VmRSS %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmRSS in /proc/self/status")
}
