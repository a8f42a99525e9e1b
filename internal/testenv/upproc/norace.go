//go:build !race

package upproc

const raceEnabled = false
