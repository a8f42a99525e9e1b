package controlplane

import (
	"net"
	"testing"
)

// A new data directory's port is one the kernel never hands out by itself, so that no
// other program's bind(0) or connect() takes it while the control plane restarts.
func TestListenStableAvoidsTheEphemeralRange(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ephLow, ephHi int
		anyPort       bool // the range leaves no room below NodePorts: any free port
	}{
		{name: "linux default", ephLow: 32768, ephHi: 60999},
		{name: "starts inside", ephLow: 25000, ephHi: 60999},
		{name: "ends inside", ephLow: 1024, ephHi: 24999},
		{name: "covers it", ephLow: 1024, ephHi: 65535, anyPort: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 {
				ln, err := listenStable(tc.ephLow, tc.ephHi)
				if err != nil {
					t.Fatal(err)
				}
				p := ln.Addr().(*net.TCPAddr).Port
				ln.Close()
				if tc.anyPort {
					continue
				}
				if p >= tc.ephLow && p <= tc.ephHi {
					t.Fatalf("port %d is in the ephemeral range %d-%d", p, tc.ephLow, tc.ephHi)
				}
				if p < stableLow || p >= stableHigh {
					t.Fatalf("port %d outside %d-%d", p, stableLow, stableHigh-1)
				}
			}
		})
	}
}

// A stopped control plane's port comes back on the next start, even while other programs
// bind ports the kernel chooses; a new directory gets a port outside this machine's
// ephemeral range.
func TestListenKeepsTheRecordedPort(t *testing.T) {
	dir := t.TempDir()
	ln, err := listen(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if lo, hi := ephemeralPorts(); port >= lo && port <= hi {
		t.Errorf("new port %d is in this machine's ephemeral range %d-%d", port, lo, hi)
	}
	ln.Close()
	// Others take ports meanwhile, as the rest of a busy machine would.
	for range 200 {
		o, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
	}
	ln, err = listen(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := ln.Addr().(*net.TCPAddr).Port; got != port {
		t.Errorf("restart listens on %d, want the recorded %d", got, port)
	}
}
