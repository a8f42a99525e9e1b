package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/upproc"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "crdipc-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "crdipc")
	build := exec.Command("go", append(append([]string{"build"}, upproc.GoBuildFlags()...), "-o", binary, "../../cmd/crdipc")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building crdipc:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireKubectl: every test here drives up with kubectl, as a user does.
func requireKubectl(t *testing.T) {
	t.Helper()
	require.Tool(t, "CRDIPC_REQUIRE_KUBECTL", "kubectl")
}

// upProcess is a running `crdipc up`, and kubectl on it.
type upProcess struct{ *upproc.Process }

// startUp runs `crdipc up` on dataDir, on ports of its own, and returns once it printed its
// export line.
func startUp(t *testing.T, dataDir string, extra ...string) *upProcess {
	t.Helper()
	return startUpEnv(t, nil, dataDir, extra...)
}

// startUpEnv is startUp with env ("NAME=value") added to up's environment and to that of
// every command run on it.
func startUpEnv(t *testing.T, env []string, dataDir string, extra ...string) *upProcess {
	t.Helper()
	args := append([]string{"up", "--data-dir", dataDir, "--metrics-addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0",
		"--webhook-addr", "127.0.0.1:0", "--webhook-ops-addr", "127.0.0.1:0", "--scm-metrics-addr", "127.0.0.1:0"}, extra...)
	return &upProcess{upproc.Start(t, upproc.Options{Binary: binary, Args: args, Env: env})}
}

// startIn runs `crdipc args...` in the working directory dir ("" for the test's) and returns
// once it printed its export line.
func startIn(t *testing.T, dir string, args ...string) *upProcess {
	t.Helper()
	return &upProcess{upproc.Start(t, upproc.Options{Binary: binary, Args: args, Dir: dir})}
}

// TestUp walks through what a new user does on the first day.
func TestUp(t *testing.T) {
	requireKubectl(t)
	dataDir := t.TempDir()
	up := startUp(t, dataDir)
	if !strings.Contains(up.Output.String(), "crdipc is up in") {
		t.Fatalf("up did not report its start time:\n%s", up.Output.String())
	}

	t.Run("second up on the same data dir is refused", func(t *testing.T) {
		out, err := exec.Command(binary, "up", "--data-dir", dataDir).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "in use") {
			t.Fatalf("second up: err=%v, output:\n%s", err, out)
		}
	})

	t.Run("kubectl version parses the server's", func(t *testing.T) {
		out := up.Kubectl(t, "version")
		if !strings.Contains(out, "Server Version: v1.37.") {
			t.Errorf("kubectl version does not show a v1.37 server:\n%s", out)
		}
		b, err := exec.Command(binary, "version").CombinedOutput()
		if err != nil || !strings.Contains(string(b), "kubernetes v1.37.") {
			t.Errorf("crdipc version: %v\n%s", err, b)
		}
	})

	t.Run("kubectl get crdipc", func(t *testing.T) {
		up.Kubectl(t, "get", "crdipc", "-A")
		// The system namespace admits the privileged CSI node plugin and host-path agents.
		if got := up.Kubectl(t, "get", "namespace", "crdipc-system", "-o", `jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}`); got != "privileged" {
			t.Errorf("crdipc-system Pod Security enforce level = %q, want privileged", got)
		}
	})

	t.Run("samples apply", func(t *testing.T) {
		out := up.Kubectl(t, "apply", "-f", "../../config/samples/")
		for _, want := range []string{"book.library.crdipc.io/", "storagepoolclaim.storage.crdipc.io/", "pullrequest.scm.crdipc.io/", "branch.scm.crdipc.io/", "bitcoinnetwork.bitcoin.crdipc.io/", "cstorvolume.storage.crdipc.io/"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl apply -f config/samples/ did not create a %s:\n%s", want, out)
			}
		}
	})

	t.Run("a Book without author is refused naming spec.author", func(t *testing.T) {
		out, err := up.Run("kubectl", "apply", "-f", "../../test/testdata/invalid/book-no-author.yaml")
		if err == nil || !strings.Contains(out, "spec.author") {
			t.Fatalf("kubectl apply of a Book without author: err=%v\n%s", err, out)
		}
	})

	t.Run("crdipc call prints Ready and the Event", func(t *testing.T) {
		out, err := up.Run(binary, "call", "-f", "../../config/samples/library_v1alpha1_book.yaml", "--apply")
		if err != nil {
			t.Fatalf("crdipc call: %v\n%s", err, out)
		}
		for _, want := range []string{"Ready=True", "Events:", "Succeeded"} {
			if !strings.Contains(out, want) {
				t.Errorf("crdipc call output lacks %q:\n%s", want, out)
			}
		}
		up.Kubectl(t, "wait", "--for=condition=Ready", "book/david-copperfield", "--timeout=30s")
	})

	t.Run("crdipc call exit codes", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(bad, []byte("apiVersion: library.crdipc.io/v1alpha1\nkind: Book\nmetadata:\n  name: bad-isbn\nspec:\n  title: Typo\n  author: Anon\n  isbn: 0-306-40615-3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := up.Run(binary, "call", "-f", bad)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "checksum") {
			t.Fatalf("call of a Book the controller refuses: err=%v (want exit 1 with its message)\n%s", err, out)
		}
		// A network whose image the simulated nodes cannot run never becomes Ready: the
		// wait times out.
		never := filepath.Join(t.TempDir(), "never.yaml")
		if err := os.WriteFile(never, []byte("apiVersion: bitcoin.crdipc.io/v1alpha1\nkind: BitcoinNetwork\nmetadata:\n  name: never\nspec:\n  nodes: 1\n  image: example.com/not/bitcoind:1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err = up.Run(binary, "call", "-f", never, "--timeout", "2s")
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out, "ImageNotSimulated") {
			t.Fatalf("call that cannot finish: err=%v (want exit 2, saying why it waits)\n%s", err, out)
		}
	})

	t.Run("the sample BitcoinNetwork runs real btcd nodes, linked", func(t *testing.T) {
		_, err := (btcd.Image{}).Find()
		require.Capable(t, "CRDIPC_REQUIRE_BTCD", err)
		out, err := up.Run(binary, "call", "-f", "../../config/samples/bitcoin_v1alpha1_bitcoinnetwork.yaml", "--apply", "--timeout", "90s")
		if err != nil || !strings.Contains(out, "2 of 2 nodes ready, 1 of 1 peer links") {
			t.Fatalf("crdipc call of the sample network: %v\n%s", err, out)
		}
		pods := up.Kubectl(t, "get", "pods", "-l", "bitcoin.crdipc.io/network=regtest", "-o", "jsonpath={.items[*].status.phase}")
		if pods != "Running Running" {
			t.Errorf("network pods are %q, want two Running", pods)
		}
	})

	// Ctrl-C, then up again on the same directory: everything is still there.
	if took := up.Stop(t); took > 5*time.Second {
		t.Errorf("up took %v to stop after Ctrl-C, want ≤ 5 s", took)
	}
	again := startUp(t, dataDir)
	out := again.Kubectl(t, "get", "books", "david-copperfield", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
	if out != "True" {
		t.Fatalf("after restart, Book Ready = %q, want True", out)
	}
	again.Kubectl(t, "get", "storagepoolclaims,pullrequests,branches,bitcoinnetworks,cstorvolumes", "-A")
	if _, err := (btcd.Image{}).Find(); err == nil {
		// The network's processes ended with the first up; the second starts them again.
		again.Kubectl(t, "wait", "--for=jsonpath={.status.containerStatuses[0].restartCount}=1", "pod/regtest-0", "pod/regtest-1", "--timeout=60s")
	}
}

// TestUpRefusesAnUnsafeDataDir: the data dir holds the cluster's keys; one that others may
// write into is refused before anything is started in it.
func TestUpRefusesAnUnsafeDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "up", "--data-dir", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "writable by group or others") {
		t.Fatalf("up on a group-writable data dir: err=%v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("up wrote into the refused data dir: %v", entries)
	}
}
