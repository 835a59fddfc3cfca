package scenario

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSampleSyscallsCountsWrites(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before, err := sampleSyscalls()
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := w.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	after, err := sampleSyscalls()
	if err != nil {
		t.Fatal(err)
	}
	// Ten writes, plus the read of /proc/self/io itself.
	if d := after - before; d < 10 {
		t.Errorf("10 writes counted as %d syscalls", d)
	}
}

func TestCostMeterSavesProfileAndFigures(t *testing.T) {
	env := &Env{Artefacts: filepath.Join(t.TempDir(), "drain_drainer_rep1")}
	res := NewResult()
	m, err := startCost(env, res)
	if err != nil {
		t.Fatal(err)
	}
	defer m.end()
	if _, err := m.stop(res, 1000); err != nil {
		t.Fatal(err)
	}
	if len(res.Artefacts) != 1 || res.Artefacts[0] != env.Artefacts+".pprof" {
		t.Fatalf("artefacts %v, want the profile at %s.pprof", res.Artefacts, env.Artefacts)
	}
	if st, err := os.Stat(res.Artefacts[0]); err != nil || st.Size() == 0 {
		t.Errorf("profile: %v, %v", st, err)
	}
	for _, k := range []string{"cpu_s_per_100k", "syscalls_per_msg", "nvcsw_per_msg", "phase_s"} {
		if _, ok := res.Metrics[k]; !ok {
			t.Errorf("no %s in %v", k, res.Metrics)
		}
	}
}

func TestEnvCountAndArtefactPath(t *testing.T) {
	if n := (&Env{}).Count(200, 2); n != 200 {
		t.Errorf("default count %d", n)
	}
	if n := (&Env{Quick: true}).Count(200, 2); n != 2 {
		t.Errorf("quick count %d", n)
	}
	if n := (&Env{Quick: true, Messages: 50}).Count(200, 2); n != 50 {
		t.Errorf("-n count %d", n)
	}
	if p := (&Env{}).ArtefactPath(".pprof"); p != "" {
		t.Errorf("no artefacts asked for, got %q", p)
	}
}
