// Package btcd runs the containers of BitcoinNetwork pods on the simulated nodes of
// `crdipc up`, which have no container runtime, as btcd processes: btcd is a full Bitcoin
// node written in Go that speaks the same peer-to-peer protocol and answers the JSON-RPC
// calls the operator makes (getpeerinfo, addnode). Image runs bitcoind containers
// (spec.implementation bitcoind), translating bitcoind's flags; NativeImage runs btcd
// containers (spec.implementation btcd) with their own. The nodes are real: they listen on
// their pod's IP, connect to each other and exchange blocks. On a real cluster the pods run
// the image they name and this package is not used.
package btcd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/crdipc/crdipc/internal/podsim"
)

// Module is the btcd release `make test-deps` installs (go install Module).
const Module = "github.com/btcsuite/btcd@v0.26.2"

// Image is the podsim.Image for bitcoin/bitcoin.
type Image struct {
	// Binary is the btcd executable; default $CRDIPC_BTCD, else btcd on $PATH or in
	// $(go env GOPATH)/bin.
	Binary string
}

// Find returns the btcd binary to run, or an error telling how to install it.
func (i Image) Find() (string, error) {
	for _, p := range []string{i.Binary, os.Getenv("CRDIPC_BTCD")} {
		if p != "" {
			return p, nil
		}
	}
	if p, err := exec.LookPath("btcd"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	if p := filepath.Join(gopath, "bin", "btcd"); gopath != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("btcd is not installed, so this simulated node cannot run bitcoin/bitcoin: run `go install %s` (make test-deps does)", Module)
}

// Command implements podsim.Image: bitcoind's flags translated to btcd's. P2P listens on
// the pod IP; RPC on a free 127.0.0.1 port that the runtime forwards the pod's RPC port to,
// since btcd serves plain-HTTP RPC (as bitcoind does) only on 127.0.0.1.
func (i Image) Command(p *corev1.Pod, c *corev1.Container, ip string, env map[string]string, dir string) (*podsim.Process, error) {
	bin, err := i.Find()
	if err != nil {
		return nil, err
	}
	flags := bitcoindFlags(append(append([]string{}, c.Command...), c.Args...), env)
	chain := ""
	p2p, rpc := "8333", "8332"
	switch {
	case flags["regtest"] == "1":
		chain, p2p, rpc = "--regtest", "18444", "18443"
	case flags["testnet"] == "1":
		chain, p2p, rpc = "--testnet", "18333", "18332"
	}
	if v := flags["port"]; v != "" {
		p2p = v
	}
	if v := flags["rpcport"]; v != "" {
		rpc = v
	}
	rpcPort, err := strconv.ParseInt(rpc, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("bitcoind -rpcport=%q: %w", rpc, err)
	}
	if flags["rpcuser"] == "" || flags["rpcpassword"] == "" {
		return nil, errors.New("bitcoind needs -rpcuser and -rpcpassword here: btcd has no cookie authentication")
	}
	local, err := freeLocalAddr()
	if err != nil {
		return nil, err
	}
	// The chain goes where bitcoind's -datadir says when a volume is mounted there (a
	// PersistentVolumeClaim keeps it across pod restarts and nodes); else in the pod's
	// directory.
	datadir := filepath.Join(dir, "data")
	if d := flags["datadir"]; d != "" {
		for _, vm := range c.VolumeMounts {
			if filepath.Clean(vm.MountPath) == filepath.Clean(d) {
				datadir = d
			}
		}
	}
	args := []string{
		"--datadir=" + datadir, "--logdir=" + filepath.Join(dir, "logs"),
		"--configfile=" + filepath.Join(dir, "btcd.conf"),
		"--listen=" + net.JoinHostPort(ip, p2p), "--externalip=" + ip,
		"--rpclisten=" + local, "--notls",
		"--rpcuser=" + flags["rpcuser"], "--rpcpass=" + flags["rpcpassword"],
		// A simulated network is closed: no DNS seeds, no outside peers.
		"--nodnsseed",
	}
	if chain != "" {
		args = append(args, chain)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// btcd reads its config file if present and warns otherwise; an empty one is quiet.
	if err := os.WriteFile(filepath.Join(dir, "btcd.conf"), nil, 0o600); err != nil {
		return nil, err
	}
	return &podsim.Process{
		Cmd:     exec.Command(bin, args...),
		Forward: map[int32]string{int32(rpcPort): local},
	}, nil
}

// bitcoindFlags parses bitcoind's -name=value flags (the command's first word, bitcoind, is
// skipped), with $(VAR) references replaced from env; "-name" alone means 1.
func bitcoindFlags(words []string, env map[string]string) map[string]string {
	flags := map[string]string{}
	for _, w := range words {
		if !strings.HasPrefix(w, "-") {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if !ok {
			value = "1"
		}
		for k, v := range env {
			value = strings.ReplaceAll(value, "$("+k+")", v)
		}
		flags[name] = value
	}
	return flags
}

// freeLocalAddr returns a 127.0.0.1 address nothing listens on at the moment.
func freeLocalAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
