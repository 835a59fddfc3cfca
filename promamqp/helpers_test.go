package promamqp_test

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func itoa(n int) string { return strconv.Itoa(n) }

// gather collects c through a pedantic registry, which also checks that
// everything collected was described and is self-consistent.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		m[mf.GetName()] = mf
	}
	return m
}

// find returns the metric of family name whose labels include every pair
// of labels, or nil.
func find(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// value returns the value of a counter or gauge, failing the test if the
// series is missing.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(mfs, name, labels)
	if m == nil {
		t.Fatalf("no series %s%v", name, labels)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

func histogramCount(t *testing.T, c prometheus.Collector, name string, labels map[string]string) int {
	t.Helper()
	m := find(gather(t, c), name, labels)
	if m == nil || m.Histogram == nil {
		t.Fatalf("no histogram %s%v", name, labels)
	}
	return int(m.Histogram.GetSampleCount())
}
