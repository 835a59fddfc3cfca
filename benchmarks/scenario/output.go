package scenario

import "time"

// Output is what one run of benchmarks/cmd/benchscenario prints as JSON,
// and what the runner reads back.
type Output struct {
	Scenario   string    `json:"scenario"`
	Case       string    `json:"case"`
	Build      string    `json:"build"`   // pristine or patched
	AMQP091    string    `json:"amqp091"` // the amqp091-go the binary was built against
	Mode       string    `json:"mode"`
	GoVersion  string    `json:"go_version"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	Started    time.Time `json:"started"`
	Seconds    float64   `json:"seconds"`
	Result     *Result   `json:"result,omitempty"`
	Error      string    `json:"error,omitempty"`
}

// A Listing describes a scenario to the runner: benchscenario -list prints
// one per scenario.
type Listing struct {
	Name  string   `json:"name"`
	Cases []string `json:"cases"`
	Modes []string `json:"modes"`
	// ReferenceCase is Scenario.ReferenceCase.
	ReferenceCase string        `json:"reference_case,omitempty"`
	Reps          int           `json:"reps"`
	QuickReps     int           `json:"quick_reps,omitempty"`
	Counted       bool          `json:"counted,omitempty"`
	Concurrent    bool          `json:"concurrent"`
	Timeout       time.Duration `json:"timeout"`
}
