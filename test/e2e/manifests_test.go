package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// TestManifests checks that the manifests shipped for a real cluster (config/storage,
// config/csi, config/bitcoin, config/scm) are valid: a server-side dry run has the API server of `crdipc up`
// decode, default, validate (strict: unknown or duplicate fields fail) and admit every object,
// against the real schemas, without storing anything.
func TestManifests(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl is not on PATH")
	}
	up := startUp(t, t.TempDir())

	for _, dir := range []string{"storage", "csi", "bitcoin"} {
		t.Run("config/"+dir, func(t *testing.T) {
			path := filepath.Join("../../config", dir)
			objects := decodeDocuments(t, path, []byte(up.kubectl(t, "kustomize", path)))
			args := []string{"apply", "--dry-run=server", "--validate=strict", "-k", path}
			out, err := up.run(t, "kubectl", args...)
			checkDryRun(t, args, out, err, len(objects))
		})
	}

	t.Run("config/scm", func(t *testing.T) {
		const dir = "../../config/scm"
		// The kustomization must build, though it cannot be applied as a whole here.
		up.kubectl(t, "kustomize", dir)
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var (
			args        []string
			objects     int
			services    []corev1.Service
			monitors    []serviceMonitor
			scrapeFiles int
		)
		for _, file := range files {
			body, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			docs := decodeDocuments(t, file, body)
			switch kinds := documentKinds(docs); {
			case slices.Equal(kinds, []string{"Kustomization"}):
				// built above
			case slices.Equal(kinds, []string{""}):
				// Not for the API server: prometheus.yml's scrape_configs, for a Prometheus
				// without the Operator. (Debian's promtool lacks kubernetes_sd_configs, so
				// it cannot check this file.)
				var cfg struct {
					ScrapeConfigs []struct {
						JobName string `json:"job_name"`
					} `json:"scrape_configs"`
				}
				if err := yaml.Unmarshal(docs[0], &cfg); err != nil {
					t.Errorf("%s: %v", file, err)
				}
				if len(cfg.ScrapeConfigs) == 0 || cfg.ScrapeConfigs[0].JobName == "" {
					t.Errorf("%s: neither a Kubernetes object nor a Prometheus scrape configuration", file)
				}
				scrapeFiles++
			case slices.Contains(kinds, "ServiceMonitor"):
				// Its CRD (monitoring.coreos.com, the Prometheus Operator's) is not installed
				// in up, so the API server cannot check it: decode it and check that it
				// selects the Services below by their port names.
				for _, d := range docs {
					var m serviceMonitor
					if err := yaml.Unmarshal(d, &m); err != nil {
						t.Fatalf("%s: %v", file, err)
					}
					if m.APIVersion != "monitoring.coreos.com/v1" || m.Kind != "ServiceMonitor" {
						t.Errorf("%s: %s %s next to a ServiceMonitor: keep it in a file of its own", file, m.APIVersion, m.Kind)
					}
					monitors = append(monitors, m)
				}
			default:
				args = append(args, "-f", file)
				objects += len(docs)
				for _, d := range docs {
					var s corev1.Service
					if err := yaml.Unmarshal(d, &s); err == nil && s.Kind == "Service" {
						services = append(services, s)
					}
				}
			}
		}
		if len(monitors) == 0 || scrapeFiles == 0 || objects == 0 {
			t.Fatalf("config/scm: %d ServiceMonitors, %d scrape configurations, %d objects: want each", len(monitors), scrapeFiles, objects)
		}
		// The objects go into the namespace crdipc-scm, which namespace.yaml creates. A dry
		// run creates nothing, so the namespace must exist for real first: admission
		// refuses objects in a namespace that does not.
		up.kubectl(t, "apply", "--validate=strict", "-f", filepath.Join(dir, "namespace.yaml"))
		args = append([]string{"apply", "--dry-run=server", "--validate=strict"}, args...)
		out, err := up.run(t, "kubectl", args...)
		checkDryRun(t, args, out, err, objects)
		for _, m := range monitors {
			checkServiceMonitor(t, m, services)
		}
	})
}

// checkDryRun checks the outcome of kubectl args (an apply --dry-run=server): no error, and
// the server answered for want objects.
func checkDryRun(t *testing.T, args []string, out string, err error, want int) {
	t.Helper()
	cmd := "kubectl " + strings.Join(args, " ")
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	if got := strings.Count(out, "(server dry run)"); got != want || want == 0 {
		t.Fatalf("%s: %d objects dry-run, want %d:\n%s", cmd, got, want, out)
	}
	t.Logf("%s:\n%s", cmd, out)
}

// decodeDocuments splits a YAML stream into its non-empty documents, as JSON.
func decodeDocuments(t *testing.T, name string, body []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(body)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s := string(bytes.TrimSpace(j)); s != "null" && s != "{}" {
			docs = append(docs, j)
		}
	}
}

// documentKinds returns the kind of each document ("" where it has none).
func documentKinds(docs [][]byte) []string {
	kinds := make([]string, len(docs))
	for i, d := range docs {
		var tm struct{ Kind string }
		_ = yaml.Unmarshal(d, &tm)
		kinds[i] = tm.Kind
	}
	return kinds
}

// serviceMonitor is the part of a monitoring.coreos.com/v1 ServiceMonitor checked here.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels      map[string]string `json:"matchLabels"`
			MatchExpressions []struct {
				Key      string   `json:"key"`
				Operator string   `json:"operator"`
				Values   []string `json:"values"`
			} `json:"matchExpressions"`
		} `json:"selector"`
		Endpoints []struct {
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// checkServiceMonitor checks that m selects Services of its namespace among services, and
// that each endpoint names a port one of them has.
func checkServiceMonitor(t *testing.T, m serviceMonitor, services []corev1.Service) {
	t.Helper()
	selected := map[string]bool{} // port names
	for _, s := range services {
		if s.Namespace != m.Metadata.Namespace || !monitorSelects(m, s.Labels) {
			continue
		}
		for _, p := range s.Spec.Ports {
			selected[p.Name] = true
		}
	}
	if len(selected) == 0 {
		t.Fatalf("ServiceMonitor %s selects none of the Services in %s", m.Metadata.Name, m.Metadata.Namespace)
	}
	for _, e := range m.Spec.Endpoints {
		if !selected[e.Port] {
			t.Errorf("ServiceMonitor %s: endpoint port %q is not a port of the Services it selects", m.Metadata.Name, e.Port)
		}
	}
}

func monitorSelects(m serviceMonitor, labels map[string]string) bool {
	for k, v := range m.Spec.Selector.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range m.Spec.Selector.MatchExpressions {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}
