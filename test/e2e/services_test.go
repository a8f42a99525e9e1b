package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/testenv/collector"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// TestUpServicesBooks: `up --services=books` runs the Book controller and nothing else, and
// runs it as its ServiceAccount, with only its role. With OTEL_EXPORTER_OTLP_ENDPOINT set,
// as in the user's shell, a `crdipc call --trace` is one trace at the collector: the
// sender's spans, kube-apiserver's and the receiver's.
func TestUpServicesBooks(t *testing.T) {
	requireKubectl(t)
	col, err := collector.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Registered before up's cleanup, so it runs after: up's last spans may still arrive.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = col.Stop(ctx)
	})
	up := startUpEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + col.HTTP}, t.TempDir(), "--services=books")
	if !regexp.MustCompile(`services: books\s`).MatchString(up.Output.String()) {
		t.Fatalf("up --services=books did not start only books:\n%s", up.Output.String())
	}
	id := callTraced(t, up, consoleURL(t, up), "../../config/samples/library_v1alpha1_book.yaml")
	up.Kubectl(t, "wait", "--for=condition=Ready", "book/david-copperfield", "--timeout=30s")
	collectorHasTrace(t, col, id)
	// No simulated nodes, so no other service: no Node was created.
	if nodes := up.Kubectl(t, "get", "nodes", "-o", "name"); strings.TrimSpace(nodes) != "" {
		t.Errorf("up --services=books created nodes: %s", nodes)
	}
	books := "system:serviceaccount:crdipc-system:crdipc-books"
	for _, c := range []struct {
		verb, resource, want string
	}{
		{"create", "pods", "no"},
		{"get", "secrets", "no"},
		{"update", "cstorvolumes.storage.crdipc.io", "no"},
		{"update", "books.library.crdipc.io/status", "yes"},
		{"create", "events", "yes"},
	} {
		out, _ := up.Run("kubectl", "auth", "can-i", "--as="+books, c.verb, c.resource)
		if got := strings.TrimSpace(out); got != c.want {
			t.Errorf("kubectl auth can-i --as=%s %s %s = %q, want %s", books, c.verb, c.resource, got, c.want)
		}
	}
}

// collectorHasTrace waits until the collector holds trace id from the sender, kube-apiserver
// and the books receiver, joined as one request: kube-apiserver's spans under the sender's
// HTTP spans, the reconcile under the sender's call span.
func collectorHasTrace(t *testing.T, col *collector.Collector, id string) {
	t.Helper()
	tid, err := trace.TraceIDFromHex(id)
	if err != nil {
		t.Fatalf("trace id %q: %v", id, err)
	}
	// up's and call's batch span processors export every few seconds.
	wait.Eventually(t, 30*time.Second, "the collector to hold trace "+id+" from crdipc-call, kube-apiserver and books", func(context.Context) (bool, error) {
		spans := col.Spans(func(s collector.Span) bool { return s.TraceID == tid })
		sender := map[trace.SpanID]bool{}
		var call, reconcile, handle *collector.Span
		for i, s := range spans {
			switch {
			case s.Service == "crdipc-call":
				sender[s.SpanID] = true
				if s.Name == "call Book" {
					call = &spans[i]
				}
			case s.Service == "books" && s.Name == "reconcile Book":
				reconcile = &spans[i]
			case s.Service == "books" && s.Name == "handle Book":
				handle = &spans[i]
			}
		}
		apiserver := false
		for _, s := range spans {
			apiserver = apiserver || (s.Service == "kube-apiserver" && sender[s.Parent])
		}
		switch {
		case call == nil:
			return false, fmt.Errorf("no crdipc-call span %q among %v", "call Book", spans)
		case !apiserver:
			return false, fmt.Errorf("no kube-apiserver span under a crdipc-call span among %v", spans)
		case reconcile == nil || handle == nil:
			return false, fmt.Errorf("no books spans %q and %q among %v", "reconcile Book", "handle Book", spans)
		case reconcile.Parent != call.SpanID:
			t.Fatalf("the reconcile %v is not under the call span %v", reconcile, call)
		case handle.Parent != reconcile.SpanID:
			t.Fatalf("the handler %v is not under the reconcile %v", handle, reconcile)
		}
		t.Logf("the collector holds trace %s: %d spans", id, len(spans))
		return true, nil
	})
}

// serviceProcess is one crdipc service running as an OS process of its own, restarted
// after it is killed, as its Deployment or DaemonSet would restart it.
type serviceProcess struct {
	name string
	args []string
	log  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts int
}

func (s *serviceProcess) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, s.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", s.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
}

// kill is SIGKILL: no shutdown, no Lease released, whatever was half done stays so.
func (s *serviceProcess) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// exitedEarly reports a process that ended without being killed.
func (s *serviceProcess) exitedEarly() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

func (s *serviceProcess) stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestProcessPerService is the shape of a real cluster: `up --services=none` is the control
// plane alone, and every service runs as its own `crdipc <service>` process with a
// kubeconfig holding its ServiceAccount's token (a pool agent per node), with only the API
// server between them. The books, storage, CSI, SCM and bitcoin flows run while a random
// service process is SIGKILLed and restarted, again and again: every request completes,
// nothing is created twice, no file is left behind.
func TestProcessPerService(t *testing.T) {
	requireKubectl(t)
	_, btcdErr := (btcd.Image{}).Find()
	require.Capable(t, "CRDIPC_REQUIRE_BTCD", btcdErr)
	dataDir := t.TempDir()
	up := startUp(t, dataDir, "--services=none")
	if !regexp.MustCompile(`services: none\s`).MatchString(up.Output.String()) {
		t.Fatalf("up --services=none started services:\n%s", up.Output.String())
	}
	ids := filepath.Join(dataDir, "identities")
	kubeconfig := func(ns, service string) string {
		k := filepath.Join(ids, ns, "crdipc-"+service+".kubeconfig")
		if _, err := os.Stat(k); err != nil {
			t.Fatalf("up wrote no kubeconfig for %s: %v", service, err)
		}
		return k
	}
	sys := "crdipc-system"
	run := filepath.Join(dataDir, "run")
	secret := filepath.Join(run, "webhook-secret")
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("process-per-service\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hookAddr, scmMetricsAddr := freePort(t), freePort(t)
	csiSock := filepath.Join(run, "csi", "csi.sock")
	noHTTP := []string{"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}
	procs := []*serviceProcess{
		{name: "books", args: append([]string{"books", "--kubeconfig", kubeconfig(sys, "books")}, noHTTP...)},
		{name: "storage-operator", args: append([]string{"storage-operator", "--kubeconfig", kubeconfig(sys, "storage-operator")}, noHTTP...)},
		{name: "csi-driver", args: []string{"csi-driver", "--kubeconfig", kubeconfig(sys, "csi-driver"), "--endpoint", csiSock, "--target-dir", filepath.Join(run, "csi", "targets"), "--http-bind-address", "0"}},
		{name: "csi-sidecar", args: append([]string{"csi-sidecar", "--kubeconfig", kubeconfig(sys, "csi-sidecar"), "--driver-endpoint", csiSock}, noHTTP...)},
		{name: "bitcoin-operator", args: append([]string{"bitcoin-operator", "--kubeconfig", kubeconfig(sys, "bitcoin-operator")}, noHTTP...)},
		{name: "webhook-listener", args: []string{"webhook-listener", "--kubeconfig", kubeconfig("crdipc-scm", "webhook-listener"), "--namespace", "default", "--listen", hookAddr, "--secret-file", secret}},
		{name: "metrics-agent", args: []string{"metrics-agent", "--kubeconfig", kubeconfig("crdipc-scm", "metrics-agent"), "--namespace", "default", "--listen", scmMetricsAddr}},
		// The nodes are the cluster's, not a crdipc service: they act as up's admin, their
		// CSI node plugins as crdipc-csi-node (read-only).
		{name: "nodes", args: []string{"nodes", "--kubeconfig", up.Kubeconfig, "--count", "3", "--root", filepath.Join(run, "pods"), "--csi-dir", filepath.Join(run, "csi-nodes"), "--csi-kubeconfig", kubeconfig(sys, "csi-node")}},
	}
	logs := filepath.Join(run, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		p.log = filepath.Join(logs, p.name+".log")
		p.start(t)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.stop()
		}
		if t.Failed() {
			for _, p := range procs {
				b, err := os.ReadFile(p.log)
				if err != nil {
					b = []byte(err.Error())
				}
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s (restarted %d times), last lines:\n%s", p.name, p.restarts, b)
			}
		}
	}) // A pool agent acts with a token bound to its node (on a cluster, its DaemonSet pod's
	// projected token): the node restriction admits nothing else. The nodes come first.
	up.Eventually(t, time.Minute, "three simulated nodes", func(context.Context) (bool, error) {
		nodes := strings.Fields(up.Kubectl(t, "get", "nodes", "-o", "name"))
		if len(nodes) != 3 {
			return false, fmt.Errorf("nodes: %v", nodes)
		}
		return true, nil
	})
	for i := 1; i <= 3; i++ {
		node := fmt.Sprintf("node-%d", i)
		token := strings.TrimSpace(up.Kubectl(t, "create", "token", "crdipc-pool-agent", "-n", sys, "--bound-object-kind", "Node", "--bound-object-name", node, "--duration", "2h"))
		agentKubeconfig := filepath.Join(run, "pool-agent-"+node+".kubeconfig")
		kc, err := clientcmd.LoadFromFile(kubeconfig(sys, "pool-agent"))
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range kc.AuthInfos {
			a.TokenFile, a.Token = "", token
		}
		if err := clientcmd.WriteToFile(*kc, agentKubeconfig); err != nil {
			t.Fatal(err)
		}
		p := &serviceProcess{name: "pool-agent-" + node, log: filepath.Join(logs, "pool-agent-"+node+".log"), args: []string{
			"pool-agent", "--kubeconfig", agentKubeconfig, "--node", node,
			"--root", filepath.Join(run, "nodes", node), "--data-addr", fmt.Sprintf("127.1.9.%d:0", i),
			// A DaemonSet pod keeps its name across restarts: the agent takes its node's
			// Lease back at once.
			"--identity", "pool-agent-" + node, "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		}}
		p.start(t)
		procs = append(procs, p)
	}

	// The requests, sent while services die.
	up.Kubectl(t, "apply", "-f", "../../config/samples/storage_v1alpha1_storagepoolclaim.yaml")
	var manifests []string
	for i := range 6 {
		manifests = append(manifests, fmt.Sprintf(`{"apiVersion":"library.crdipc.io/v1alpha1","kind":"Book","metadata":{"name":"book-%d","namespace":"default"},"spec":{"title":"Book %d","author":"Anon"}}`, i, i))
	}
	for i := range 3 {
		manifests = append(manifests, fmt.Sprintf(`{"apiVersion":"storage.crdipc.io/v1alpha1","kind":"CStorVolume","metadata":{"name":"vol-%d","namespace":"default"},"spec":{"capacity":"64Mi","replicationFactor":3}}`, i))
	}
	for i := range 2 {
		manifests = append(manifests, fmt.Sprintf(`{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"claim-%d","namespace":"default"},"spec":{"storageClassName":"crdipc","accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"64Mi"}}}}`, i))
	}
	manifests = append(manifests, `{"apiVersion":"bitcoin.crdipc.io/v1alpha1","kind":"BitcoinNetwork","metadata":{"name":"regtest","namespace":"default"},"spec":{"nodes":2,"network":"regtest"}}`)
	up.Apply(t, strings.Join(manifests, "\n"))

	// Deliveries as GitHub sends them: a failed one (listener down) is redelivered until
	// it is stored, and each is also redelivered once after it was.
	fixture, err := os.ReadFile("../../internal/scm/webhook/testdata/pull_request-opened.json")
	if err != nil {
		t.Fatal(err)
	}
	deliveries := 8
	var sent sync.WaitGroup
	sent.Add(1)
	go func() {
		defer sent.Done()
		for i := range deliveries {
			body := bytes.Replace(fixture, []byte(`"number": 42,`), fmt.Appendf(nil, `"number": %d,`, 100+i), -1)
			for range 2 {
				deliver(t, "http://"+hookAddr+"/webhook", []byte("process-per-service"), fmt.Sprintf("delivery-%d", i), body)
			}
		}
	}()

	// The chaos: SIGKILL a random service process, start it again at once, 20 times.
	kills := 20
	if os.Getenv("CRDIPC_SERVICE_KILLS") != "" {
		fmt.Sscan(os.Getenv("CRDIPC_SERVICE_KILLS"), &kills)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	killed := map[string]int{}
	// The chaos keeps the cluster's pace: the next kill comes once the services have moved on
	// since the last one, a random 1 to 3 writes to crdipc-system's Leases later (leader,
	// heartbeat and node Leases are renewed every few seconds while services run).
	adminCfg, err := clientcmd.BuildConfigFromFlags("", up.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(adminCfg)
	leasesVersion := func(ctx context.Context) (string, error) {
		l, err := kube.CoordinationV1().Leases(sys).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		return l.ResourceVersion, nil
	}
	movedOn := func(renewals int) {
		for range renewals {
			before, err := leasesVersion(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			up.Eventually(t, 30*time.Second, "a Lease renewed since the last kill", func(ctx context.Context) (bool, error) {
				now, err := leasesVersion(ctx)
				if err != nil {
					return false, err
				}
				if now == before {
					return false, fmt.Errorf("Leases still at resourceVersion %s", now)
				}
				return true, nil
			})
		}
	}
	for range kills {
		movedOn(1 + rng.IntN(3))
		for _, p := range procs {
			if p.exitedEarly() {
				b, _ := os.ReadFile(p.log)
				t.Fatalf("%s exited on its own:\n%s", p.name, b)
			}
		}
		p := procs[rng.IntN(len(procs))]
		p.kill()
		p.restarts++
		killed[p.name]++
		p.start(t)
	}
	t.Logf("killed: %v", killed)
	sent.Wait()
	t.Log("every delivery stored; waiting for the requests")

	// Every request completes.
	for i := range 6 {
		up.Kubectl(t, "wait", "--for=condition=Ready", fmt.Sprintf("book/book-%d", i), "--timeout=120s")
	}
	for i := range 3 {
		up.Kubectl(t, "wait", "--for=condition=Ready", fmt.Sprintf("cstorvolume/vol-%d", i), "--timeout=120s")
	}
	for i := range 2 {
		up.Kubectl(t, "wait", "--for=jsonpath={.status.phase}=Bound", fmt.Sprintf("pvc/claim-%d", i), "--timeout=120s")
	}
	t.Log("books, volumes and claims done")
	up.Kubectl(t, "wait", "--for=condition=Ready", "bitcoinnetwork/regtest", "--timeout=180s")
	up.Eventually(t, time.Minute, "every pull request delivered", func(context.Context) (bool, error) {
		prs := strings.Fields(up.Kubectl(t, "get", "pullrequests", "-o", "name"))
		if len(prs) != deliveries {
			return false, fmt.Errorf("%d pull requests, want %d", len(prs), deliveries)
		}
		return true, nil
	})

	// Nothing twice: one pool per node, three replicas per volume, one Event per delivery.
	pools := strings.Fields(up.Kubectl(t, "get", "cstorpools", "-o", "jsonpath={.items[*].spec.nodeName}"))
	sort.Strings(pools)
	if strings.Join(pools, " ") != "node-1 node-2 node-3" {
		t.Errorf("pools on nodes %v, want one on each of node-1..3", pools)
	}
	var replicas struct {
		Items []struct {
			Metadata struct{ Namespace, Name string }
			Spec     struct{ Volume, Pool, NodeName string }
		}
	}
	if err := json.Unmarshal([]byte(up.Kubectl(t, "get", "cstorvolumereplicas", "-A", "-o", "json")), &replicas); err != nil {
		t.Fatal(err)
	}
	perVolume := map[string]map[string]bool{}
	for _, r := range replicas.Items {
		v := r.Metadata.Namespace + "/" + r.Spec.Volume
		if perVolume[v] == nil {
			perVolume[v] = map[string]bool{}
		}
		if perVolume[v][r.Spec.NodeName] {
			t.Errorf("volume %s has two replicas on %s", v, r.Spec.NodeName)
		}
		perVolume[v][r.Spec.NodeName] = true
	}
	for v, nodes := range perVolume {
		if len(nodes) != 3 {
			t.Errorf("volume %s has replicas on %d nodes, want 3", v, len(nodes))
		}
	}
	if len(perVolume) != 5 {
		t.Errorf("%d volumes have replicas, want 5 (3 CStorVolumes, 2 claims)", len(perVolume))
	}
	events := strings.Fields(up.Kubectl(t, "get", "events", "--field-selector", "involvedObject.kind=PullRequest", "-o", "jsonpath={.items[*].count}"))
	if len(events) != deliveries {
		t.Errorf("%d Events about pull requests, want one per delivery (%d)", len(events), deliveries)
	}
	for _, c := range events {
		if c != "1" && c != "" {
			t.Errorf("an Event about a pull request was counted %s times: a delivery was recorded twice", c)
		}
	}

	// No orphan files: every replica file on the nodes belongs to a replica object.
	want := map[string]bool{}
	for _, r := range replicas.Items {
		want[filepath.Join(r.Spec.NodeName, "pools", r.Spec.Pool, r.Metadata.Namespace, r.Metadata.Name+".img")] = true
	}
	nodesDir := filepath.Join(run, "nodes")
	err = filepath.Walk(nodesDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".img") {
			return err
		}
		rel, _ := filepath.Rel(nodesDir, path)
		if !want[rel] {
			t.Errorf("orphan replica file %s", rel)
		}
		delete(want, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for f := range want {
		t.Errorf("replica file %s is missing", f)
	}
}

// deliver posts one signed delivery until the listener stores it (2xx), as GitHub
// redelivers a failed one.
func deliver(t *testing.T, url string, secret []byte, id string, body []byte) {
	err := wait.Until(context.Background(), 3*time.Minute, func(ctx context.Context) (bool, error) {
		req, err := delivery.New(ctx, url, secret, "pull_request", id, body)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 4 {
			return false, fmt.Errorf("delivery %s refused: %s", id, resp.Status)
		}
		if resp.StatusCode/100 != 2 {
			return false, fmt.Errorf("delivery %s: %s", id, resp.Status)
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("delivery %s never stored: %v", id, err)
	}
}
