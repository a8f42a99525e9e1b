//go:build race

package upproc

const raceEnabled = true
