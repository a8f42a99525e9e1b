package controlplane

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/crdipc/crdipc/internal/safefile"
)

// listen binds the API server's loopback port: port if given; else the port the data
// directory's previous run recorded, if it is free; else a new one, recorded for the next run.
// It binds before the server starts, so no other process can take the port between
// choosing and serving.
func listen(dir string, port int) (net.Listener, error) {
	portFile := filepath.Join(dir, "port")
	if port != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("listening on 127.0.0.1:%d: %w", port, err)
		}
		return ln, recordPort(portFile, ln)
	}
	if b, err := safefile.ReadFile(portFile); err == nil {
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strings.TrimSpace(string(b))); err == nil {
			return ln, nil
		}
	}
	ln, err := listenStable(ephemeralPorts())
	if err != nil {
		return nil, err
	}
	return ln, recordPort(portFile, ln)
}

// Where a new data directory's port is chosen: below Kubernetes' NodePort range
// (30000–32767) and above the well-known ports of the components of a cluster (10250
// and the like).
const (
	stableLow  = 20000
	stableHigh = 30000 // exclusive
)

// listenStable binds a free loopback port outside the kernel's ephemeral range
// [ephLow, ephHigh]. A port the kernel hands out itself (bind to port 0, the local end
// of connect) may be taken by any program on the machine in the seconds a restart
// leaves it free, and the restarted control plane would then move, stranding every
// kubeconfig and client that named the old one. A port outside that range is given to
// no one who does not ask for it by number. Only when the range leaves no room does it
// take any free port.
func listenStable(ephLow, ephHigh int) (net.Listener, error) {
	lo, hi := stableLow, stableHigh
	if ephLow <= lo && ephHigh >= lo {
		lo = ephHigh + 1
	}
	if ephLow > lo && ephLow < hi {
		hi = ephLow
	}
	for i := 0; lo < hi && i < 32; i++ {
		p := lo + rand.IntN(hi-lo)
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			return ln, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on loopback: %w", err)
	}
	return ln, nil
}

// ephemeralPorts is the kernel's range of ports it hands out itself
// (net.ipv4.ip_local_port_range), Linux's default when it cannot be read.
func ephemeralPorts() (low, high int) {
	low, high = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return low, high
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l > h {
		return low, high
	}
	return l, h
}

func recordPort(path string, ln net.Listener) error {
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if err := safefile.Write(path, []byte(port+"\n"), 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("recording port: %w", err)
	}
	return nil
}
