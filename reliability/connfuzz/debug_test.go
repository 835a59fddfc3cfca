package connfuzz

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// debugDirEnv names a directory where FuzzConnection keeps what the
// fuzzing engine throws away; scripts/fuzz sets it. The engine discards a
// worker process's output, so when a panic on some goroutine other than
// the input's own kills the worker, or the engine's own 10 s limit does,
// go test reports only "fuzzing process hung or terminated unexpectedly:
// exit status 2", and while minimizing it does not even keep the input.
// With the variable set, each worker writes its standard error to
// stderr-PID (the panic and its stack) and every input, before it runs,
// to input-PID in the corpus format, ready for testdata/fuzz.
const debugDirEnv = "CONNFUZZ_DEBUG_DIR"

// init sends a worker's standard error to the debug directory. It goes by
// the worker's flag, which flag parsing has not seen yet: the coordinator
// prints its progress there and must keep it.
func init() {
	dir := os.Getenv(debugDirEnv)
	if dir == "" || !isFuzzWorker() {
		return
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("stderr-%d", os.Getpid())))
	if err != nil {
		return
	}
	// The runtime writes a fatal panic to file descriptor 2 itself.
	_ = syscall.Dup2(int(f.Fd()), 2)
}

func isFuzzWorker() bool {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.fuzzworker") {
			return true
		}
	}
	return false
}

// recordInput writes the input about to run to the debug directory, if
// there is one, over the previous one.
func recordInput(mode, ctl uint8, stream []byte) {
	dir := os.Getenv(debugDirEnv)
	if dir == "" {
		return
	}
	entry := fmt.Sprintf("go test fuzz v1\nbyte('\\x%02x')\nbyte('\\x%02x')\n[]byte(%q)\n", mode, ctl, stream)
	_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("input-%d", os.Getpid())), []byte(entry), 0o644)
}
