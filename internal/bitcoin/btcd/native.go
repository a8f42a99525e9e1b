package btcd

import (
	"net"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/crdipc/crdipc/internal/podsim"
)

// NativeImageName is the repository of the btcd image whose pods (BitcoinNetworks with
// spec.implementation btcd) NativeImage runs.
const NativeImageName = "btcsuite/btcd"

// NativeImage is the podsim.Image for btcd images: their pods already run btcd, with btcd's
// flags, so the process is the pod's own command line. Only what a container would get from
// its namespaces is supplied: wildcard listen addresses are bound to the pod IP (the
// simulated pods share the host's network), and paths outside the volumes the process
// really has mounted are moved into the pod's directory (they share its file system too).
type NativeImage struct {
	// Binary is the btcd executable, found as Image.Find finds it.
	Binary string
}

// Command implements podsim.Image.
func (i NativeImage) Command(_ *corev1.Pod, c *corev1.Container, ip string, env map[string]string, dir string) (*podsim.Process, error) {
	bin, err := Image{Binary: i.Binary}.Find()
	if err != nil {
		return nil, err
	}
	words := append(append([]string{}, c.Command...), c.Args...)
	if len(words) > 0 && filepath.Base(words[0]) == "btcd" {
		words = words[1:] // the image's entrypoint; the host's btcd runs instead
	}
	path := func(p string) string { return hostPath(p, c.VolumeMounts, dir) }
	args := make([]string, 0, len(words))
	for _, w := range words {
		name, value, ok := strings.Cut(w, "=")
		if ok {
			switch strings.TrimLeft(name, "-") {
			case "listen", "rpclisten":
				value = onPodIP(value, ip)
			case "datadir", "logdir", "rpccert", "rpckey", "configfile", "appdata":
				value = path(value)
			}
			w = name + "=" + value
		}
		args = append(args, w)
	}
	// btcd keeps what no flag places in $HOME/.btcd; without HOME, in the pod's directory,
	// as the runtime would have it.
	home := dir
	if h := env["HOME"]; h != "" {
		home = path(h)
	}
	vars := make([]string, 0, len(env)+1)
	for k, v := range env {
		if k != "HOME" {
			vars = append(vars, k+"="+v)
		}
	}
	vars = append(vars, "HOME="+home)
	sort.Strings(vars)
	cmd := exec.Command(bin, args...)
	cmd.Env = vars
	return &podsim.Process{Cmd: cmd}, nil
}

// onPodIP binds a wildcard listen address (":port", "0.0.0.0:port", "[::]:port") to ip.
func onPodIP(addr, ip string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0", "::":
		return net.JoinHostPort(ip, port)
	}
	return addr
}

// hostPath is where path p of the container is on the host: itself under a volume mounted
// in the process's mount namespace, else the same path under the pod's directory.
func hostPath(p string, mounts []corev1.VolumeMount, dir string) string {
	clean := filepath.Clean(p)
	for _, m := range mounts {
		mp := filepath.Clean(m.MountPath)
		if clean == mp || strings.HasPrefix(clean, mp+string(filepath.Separator)) {
			return clean
		}
	}
	return filepath.Join(dir, clean)
}
