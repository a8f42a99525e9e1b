package crdipc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/crdipc/crdipc"

// importRules are the module's layers. A rule's packages (from) must not depend, directly
// or through other packages, on the packages it forbids, unless they are allowed.
// Patterns are module-relative paths; "x/..." is x and every package below it.
var importRules = []struct {
	name   string
	from   []string
	forbid []string
	allow  []string
	// tests: the rule covers the packages' test files (in-package and _test package,
	// examples included) as well.
	tests  bool
	reason string
}{
	{
		name:   "operator and agent meet only in the API",
		from:   []string{"internal/storage/operator/..."},
		forbid: []string{"internal/storage/agent/..."},
		reason: "operator and pool agents talk through CStorPool and CStorVolumeReplica objects, never directly; " +
			"names they share (finalizer, node Lease) live in api/storage/v1alpha1",
	},
	{
		name:   "CSI uses storage through its API and data path",
		from:   []string{"internal/csi/..."},
		forbid: []string{"internal/storage/operator/...", "internal/storage/agent/...", "internal/storage/backend/..."},
		allow:  []string{"internal/storage/target/...", "internal/storage/blockdev/...", "internal/storage/dataca/...", "internal/storage/replica/..."},
		reason: "the CSI driver creates CStorVolumes and awaits them (CRs as IPC) and may run in another process than " +
			"the operator and agents; only the data-path client libraries come along, since its node plugin runs the volume target",
	},
	{
		name:   "the simulated kubelet knows nothing of storage",
		from:   []string{"internal/podsim/..."},
		forbid: []string{"internal/storage/..."},
		reason: "podsim runs pods on simulated nodes and mounts volumes through the CSI node service, as a kubelet does; " +
			"what marks a node simulated lives in internal/simnode",
	},
	{
		name:   "the public library stands alone",
		from:   []string{"ipc/..."},
		forbid: []string{"internal/..."},
		reason: "users import ipc from outside this module, where internal packages cannot be imported " +
			"(its examples are checked by TestIPCExamplesStandAlone; its integration tests may use the test harness)",
	},
	{
		name:   "API types stand alone",
		from:   []string{"api/..."},
		forbid: []string{"internal/..."},
		reason: "the API packages are imported by clients outside this module (and by every layer inside it)",
	},
}

// listedPackage is what `go list -json` says of one package.
type listedPackage struct {
	ImportPath   string
	Deps         []string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

func TestImports(t *testing.T) {
	pkgs := goList(t)
	byPath := map[string]*listedPackage{}
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	for _, r := range importRules {
		t.Run(r.name, func(t *testing.T) {
			forbidden := func(path string) bool {
				return path != "" && matchAny(r.forbid, path) && !matchAny(r.allow, path)
			}
			governed := 0
			for _, p := range pkgs {
				if !matchAny(r.from, rel(p.ImportPath)) {
					continue
				}
				governed++
				seen := map[string]bool{}
				// A forbidden import is reported, not what it brings along; an allowed one
				// is looked through.
				check := func(what string, imports []string) {
					for _, imp := range imports {
						deps := []string{imp}
						if !forbidden(rel(imp)) {
							deps = depsOf(byPath, imp)
						}
						for _, dep := range deps {
							d := rel(dep)
							if seen[what+d] || !forbidden(d) {
								continue
							}
							seen[what+d] = true
							via := ""
							if dep != imp {
								via = " (through " + rel(imp) + ")"
							}
							t.Errorf("%s%s imports %s%s: %s", rel(p.ImportPath), what, d, via, r.reason)
						}
					}
				}
				check("", p.Imports)
				if r.tests {
					check(" (tests)", p.TestImports)
					check(" (_test package)", p.XTestImports)
				}
			}
			if governed == 0 {
				t.Errorf("no package matches %v: the rule is stale", r.from)
			}
		})
	}
}

// goList lists every package of the module with its dependencies.
func goList(t *testing.T) []*listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Deps,Imports,TestImports,XTestImports,Error", "./...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []*listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := &listedPackage{}
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		// A package that does not load has no trustworthy imports; it cannot pass.
		if p.Error != nil {
			t.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// depsOf is what importing path brings along: its own dependencies, when it is one of the
// module's packages (no other package can reach the module's internal ones).
func depsOf(byPath map[string]*listedPackage, path string) []string {
	if p, ok := byPath[path]; ok {
		return p.Deps
	}
	return nil
}

// rel is path relative to the module, or "" for a package outside it.
func rel(path string) string {
	if path == module {
		return "."
	}
	r, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	return r
}

func matchAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool {
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			return path == base || strings.HasPrefix(path, base+"/")
		}
		return path == p
	})
}

// TestIPCExamplesStandAlone: the runnable examples of the public ipc package import no
// internal package, so a user can copy one into a module of their own and build it.
func TestIPCExamplesStandAlone(t *testing.T) {
	files, err := filepath.Glob("ipc/example*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no ipc examples found: %v", err)
	}
	for _, f := range files {
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, module+"/internal/") {
				t.Errorf("%s imports %s: users cannot copy it", f, path)
			}
		}
	}
}
