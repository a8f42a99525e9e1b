//go:build race

package replica

// raceEnabled shrinks the throughput test, which measures nothing useful under the race
// detector.
const raceEnabled = true
