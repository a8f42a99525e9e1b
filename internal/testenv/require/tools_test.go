package require_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// freshMachine is what a fresh machine has before any install script runs (Go, gcc,
// kubectl, Node and the Debian packages of the env's installed-go.txt), by the package
// that brings each command. Only commands a capability check names need to be here.
var freshMachine = []string{
	"go",                         // the Go toolchain in /usr/local/go
	"gcc",                        // gcc
	"kubectl",                    // kubectl
	"apt-get",                    // apt
	"ip",                         // iproute2
	"mount", "umount", "losetup", // mount
	"blkid", "blockdev", "nsenter", "unshare", // util-linux
	"mkfs.ext4", "e2fsck", "debugfs", "resize2fs", // e2fsprogs
	"cp", "dd", "sync", "sleep", // coreutils
	"curl", // curl
}

// installScripts print the commands each guarantees, from the lists they install from.
var installScripts = [][]string{
	{"hack/test-deps.sh", "--list"}, // make test runs it before any test
	{"hack/realnode.sh", "tools"},   // test/realnode runs deps before it checks for them
}

// TestInstalledToolsCoverCapabilityChecks: every tool a test's capability check looks up is
// installed by an install script or on a fresh machine, so that CI on a fresh machine never
// fails (nor, on a laptop, skips) for a tool nothing installs.
func TestInstalledToolsCoverCapabilityChecks(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for _, name := range freshMachine {
		have[name] = "a fresh machine"
	}
	for _, script := range installScripts {
		cmd := exec.Command("bash", script...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(script, " "), err)
		}
		tools := strings.Fields(string(out))
		if len(tools) == 0 {
			t.Fatalf("%s lists no tools", strings.Join(script, " "))
		}
		for _, tool := range tools {
			have[tool] = strings.Join(script, " ")
		}
	}

	checks, problems := scanChecks(t, root)
	for _, p := range problems {
		t.Error(p)
	}
	named := map[string]bool{}
	for _, c := range checks {
		for _, tool := range c.anyOf {
			named[tool] = true
		}
		if !slices.ContainsFunc(c.anyOf, func(tool string) bool { return have[tool] != "" }) {
			t.Errorf("%s: a capability check looks up %s, which neither %v nor a fresh machine installs: add it to an install script's list",
				c.at, strings.Join(c.anyOf, " or "), installScripts)
		}
	}
	// The scan must see the checks this test exists for: an empty scan passes nothing.
	for _, tool := range []string{"iptables", "prometheus", "chromium", "mkfs.xfs", "kubectl"} {
		if !named[tool] {
			t.Errorf("no capability check found that looks up %s: the scan misses checks", tool)
		}
	}
}

// check is one look-up of a tool: any one of anyOf will do.
type check struct {
	at    string
	anyOf []string
}

// scanChecks finds, in the repository's Go sources, the tools that capability checks look
// up: the names given to this package's Tool, Tools, Find and Missing; to exec.LookPath in
// tests and in internal/testenv; and to a test helper of the form f(t, tools ...string) in
// its package. A look-up the scan cannot read (a name that is no string literal) is a
// problem: it could name anything.
func scanChecks(t *testing.T, root string) (checks []check, problems []string) {
	t.Helper()
	fset := token.NewFileSet()
	byDir := map[string][]*ast.File{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "vendor" || name == "testdata" || name == "node_modules" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		byDir[filepath.Dir(path)] = append(byDir[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range byDir {
		// Test helpers that take the tools to look up: f(t, tools ...string).
		helpers := map[string]bool{}
		for _, f := range files {
			if !isTestScope(fset, f, root) {
				continue
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && takesTools(fn) {
					helpers[fn.Name.Name] = true
				}
			}
		}
		for _, f := range files {
			inScope := isTestScope(fset, f, root)
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				at := fset.Position(call.Pos())
				rel, _ := filepath.Rel(root, at.Filename)
				where := rel + ":" + strconv.Itoa(at.Line)
				var args []ast.Expr
				anyOf := false
				switch fun := call.Fun.(type) {
				case *ast.SelectorExpr:
					pkg, _ := fun.X.(*ast.Ident)
					switch {
					case pkg == nil:
						return true
					case pkg.Name == "require" && (fun.Sel.Name == "Tool" || fun.Sel.Name == "Tools"):
						if len(call.Args) > 2 {
							args = call.Args[2:] // after t and env
						}
						anyOf = fun.Sel.Name == "Tool"
					case pkg.Name == "require" && (fun.Sel.Name == "Find" || fun.Sel.Name == "Missing"):
						args, anyOf = call.Args, fun.Sel.Name == "Find"
					case inScope && pkg.Name == "exec" && fun.Sel.Name == "LookPath":
						args = call.Args
					default:
						return true
					}
				case *ast.Ident:
					if !helpers[fun.Name] || dir == self {
						return true
					}
					for _, a := range call.Args {
						if s, ok := stringLit(a); ok {
							checks = append(checks, check{at: where, anyOf: []string{s}})
						}
					}
					return true
				default:
					return true
				}
				if dir == self {
					return true // this package forwards its callers' names
				}
				var names []string
				for _, a := range args {
					if s, ok := stringLit(a); ok {
						names = append(names, s)
					} else if !forwardsTools(call, a) {
						problems = append(problems, where+": a capability check looks up a tool that is not named by a string literal: name it in one, so that this test sees it")
					}
				}
				if anyOf && len(names) > 0 {
					checks = append(checks, check{at: where, anyOf: names})
					return true
				}
				for _, s := range names {
					checks = append(checks, check{at: where, anyOf: []string{s}})
				}
				return true
			})
		}
	}
	return checks, problems
}

// isTestScope: a test file, or a file of internal/testenv, the test kit.
func isTestScope(fset *token.FileSet, f *ast.File, root string) bool {
	path := fset.Position(f.Pos()).Filename
	rel, _ := filepath.Rel(root, path)
	return strings.HasSuffix(path, "_test.go") || strings.HasPrefix(filepath.ToSlash(rel), "internal/testenv/")
}

// takesTools: the function's last parameter is tools ...string.
func takesTools(fn *ast.FuncDecl) bool {
	params := fn.Type.Params.List
	if len(params) == 0 {
		return false
	}
	last := params[len(params)-1]
	ell, ok := last.Type.(*ast.Ellipsis)
	if !ok || len(last.Names) != 1 || last.Names[0].Name != "tools" {
		return false
	}
	id, ok := ell.Elt.(*ast.Ident)
	return ok && id.Name == "string"
}

// forwardsTools: the argument is tools... passed on by a helper that takesTools, whose
// callers' literals the scan reads.
func forwardsTools(call *ast.CallExpr, a ast.Expr) bool {
	id, ok := a.(*ast.Ident)
	return ok && id.Name == "tools" && call.Ellipsis.IsValid()
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}
