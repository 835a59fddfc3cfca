package scenario

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
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
	user  time.Duration // the user part of cpu: the kernel's part moves with the peer's pacing
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
		user:  time.Duration(ru.Utime.Nano()),
		nvcsw: int64(ru.Nvcsw),
	}, nil
}

// A procDelta is the resource use between two samples.
type procDelta struct {
	wall, cpu, user time.Duration
	nvcsw           int64
}

// since returns what the process used between earlier and s.
func (s procSample) since(earlier procSample) procDelta {
	return procDelta{wall: s.at.Sub(earlier.at), cpu: s.cpu - earlier.cpu, user: s.user - earlier.user, nvcsw: s.nvcsw - earlier.nvcsw}
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
	threads    int64 // OS threads (Threads): one per blocking read in progress
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
	threads, err := statusField("Threads:")
	if err != nil {
		return memSample{}, err
	}
	return memSample{
		threads:    threads,
		rss:        rss,
		heapInuse:  int64(ms.HeapInuse),
		stackInuse: int64(ms.StackInuse),
		goroutines: runtime.NumGoroutine(),
	}, nil
}

// vmRSS returns the VmRSS line of /proc/self/status in bytes.
func vmRSS() (int64, error) {
	kb, err := statusField("VmRSS:")
	return kb << 10, err
}

// statusField returns the number that follows field in /proc/self/status:
// "VmRSS:	   12345 kB" (kB) or "Threads:	7".
func statusField(field string) (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read /proc/self/status: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte(field))
		if !ok {
			continue
		}
		num := bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))
		n, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s %q: %w", field, rest, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}

// sampleSyscalls returns syscr + syscw from /proc/self/io: the read and
// write system calls (read, readv, write, writev and kin) made by every
// thread of the process. Go's socket I/O goes through exactly these, so
// the count is the client's socket calls, plus the few reads of this
// file. It does not see futex, epoll_wait, nanosleep or the other calls of
// the runtime's scheduler; the voluntary context switches of getrusage
// stand in for those.
func sampleSyscalls() (int64, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, fmt.Errorf("read syscall counts: %w", err)
	}
	var total int64
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok || (string(k) != "syscr" && string(k) != "syscw") {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s in /proc/self/io: %w", k, err)
		}
		total += n
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("no syscr and syscw in /proc/self/io")
	}
	return total, nil
}

// A costMeter measures what one phase of a scenario (a drain, a run of
// publishes) costs the client: the process's CPU time and voluntary
// context switches (getrusage), its read and write system calls
// (/proc/self/io), and, when the runner asked for artefacts, a CPU
// profile of the phase alone (runtime/pprof), saved beside the results so
// that a figure can be traced to where the time went. Setup before the
// phase (a queue filled by another connection, the dial) is not in it.
type costMeter struct {
	proc    procSample
	calls   int64
	profile *os.File
}

// startCost collects the setup's garbage, starts the profile if env asks
// for one (recording its file in res), and takes the opening samples.
// The caller must call end, or stop, whatever happens.
func startCost(env *Env, res *Result) (*costMeter, error) {
	runtime.GC() // no collection of setup garbage inside the phase
	m := &costMeter{}
	if path := env.ArtefactPath(".pprof"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("CPU profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("CPU profile: %w", err)
		}
		m.profile = f
		res.Artefacts = append(res.Artefacts, path)
	}
	var err error
	if m.calls, err = sampleSyscalls(); err != nil {
		m.end()
		return nil, err
	}
	if m.proc, err = sampleProc(); err != nil {
		m.end()
		return nil, err
	}
	return m, nil
}

// stop ends the phase after n messages, records in res cpu_s_per_100k,
// syscalls_per_msg and nvcsw_per_msg, with the totals they come from
// (phase_s, cpu_s, syscalls, nvcsw), and returns the phase's wall time,
// from which the scenario reckons its own rate. The samples are taken
// before the profile stops, whose writing is not the client's cost.
func (m *costMeter) stop(res *Result, n int) (time.Duration, error) {
	proc, err := sampleProc()
	if err != nil {
		m.end()
		return 0, err
	}
	calls, err := sampleSyscalls()
	m.end()
	if err != nil {
		return 0, err
	}
	use := proc.since(m.proc)
	calls -= m.calls
	res.Set("messages", float64(n))
	res.Set("phase_s", use.wall.Seconds())
	res.Set("cpu_s", use.cpu.Seconds())
	res.Set("syscalls", float64(calls))
	res.Set("nvcsw", float64(use.nvcsw))
	if n > 0 {
		res.Set("cpu_s_per_100k", use.cpu.Seconds()*100_000/float64(n))
		res.Set("user_cpu_s_per_100k", use.user.Seconds()*100_000/float64(n))
		res.Set("syscalls_per_msg", float64(calls)/float64(n))
		res.Set("nvcsw_per_msg", float64(use.nvcsw)/float64(n))
	}
	return use.wall, nil
}

// end stops and saves the profile, if one runs; it may be called again.
func (m *costMeter) end() {
	if m.profile == nil {
		return
	}
	pprof.StopCPUProfile()
	_ = m.profile.Close()
	m.profile = nil
}
