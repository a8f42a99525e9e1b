// Package bench measures crdipc against the floor: what the API server
// itself can do on this machine in the same run. Every performance goal in
// crdipc is a ratio to that floor, because absolute numbers on a shared
// 2-core machine move by ±15% from run to run while ratios do not.
package bench
