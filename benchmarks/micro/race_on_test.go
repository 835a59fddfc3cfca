//go:build race

package micro

// raceEnabled: the race detector changes what allocates, so allocation
// counts are only checked without it.
const raceEnabled = true
