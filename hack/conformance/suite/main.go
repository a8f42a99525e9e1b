// Command suite turns test/conformance's skip list into ginkgo's --skip arguments and
// reads the junit reports of a run of Kubernetes' storage e2e suite into the counts
// docs/csi.md reports: specs run, passed, failed, skipped by the suite itself (a capability
// the test driver does not declare, a pattern it does not support) and skipped by our list.
//
//	go run ./hack/conformance/suite skips test/conformance/skips.yaml
//	go run ./hack/conformance/suite focus test/conformance/ci.yaml
//	go run ./hack/conformance/suite report --skips test/conformance/skips.yaml --driver csi.crdipc.io junit_*.xml
//
// report exits 1 when a spec failed, and also when an entry of the skip list matched no spec
// of the suite (a renamed spec would otherwise be skipped silently forever, or not at all).
package main

import (
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/onsi/ginkgo/v2/reporters"
	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "suite:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: suite skips FILE | suite focus FILE | suite report --skips FILE --driver NAME JUNIT...")
	}
	switch args[0] {
	case "skips":
		if len(args) != 2 {
			return errors.New("usage: suite skips FILE")
		}
		skips, err := readSkips(args[1])
		if err != nil {
			return err
		}
		for _, s := range skips {
			fmt.Fprintln(out, s.regexp())
		}
		return nil
	case "focus":
		// A subset by name: one regular expression matching each listed spec, literally.
		if len(args) != 2 {
			return errors.New("usage: suite focus FILE")
		}
		specs, err := readSkips(args[1])
		if err != nil {
			return err
		}
		alts := make([]string, len(specs))
		for i, s := range specs {
			alts[i] = s.regexp()
		}
		fmt.Fprintln(out, strings.Join(alts, "|"))
		return nil
	case "report":
		fs := flag.NewFlagSet("report", flag.ContinueOnError)
		skipsFile := fs.String("skips", "", "the skip list the run used")
		subsetFile := fs.String("subset", "", "the subset the run was narrowed to (suite focus): each entry must name a spec")
		driver := fs.String("driver", "csi.crdipc.io", "the test driver's name: specs of other drivers are not counted")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var skips []skip
		if *skipsFile != "" {
			var err error
			if skips, err = readSkips(*skipsFile); err != nil {
				return err
			}
		}
		r, err := readReports(fs.Args(), *driver, skips)
		if err != nil {
			return err
		}
		if *subsetFile != "" {
			subset, err := readSkips(*subsetFile)
			if err != nil {
				return err
			}
			r.checkSubset(subset)
		}
		r.print(out)
		return r.verdict()
	default:
		return fmt.Errorf("unknown subcommand %q", args[0])
	}
}

// skip is an entry of the skip list (or of a subset): one spec, by its full text as the
// suite names it, and why it cannot run here (or why it is in the subset).
type skip struct {
	Spec   string `json:"spec"`
	Reason string `json:"reason"`
}

// regexp matches the spec's text and nothing that merely resembles it.
func (s skip) regexp() string { return regexp.QuoteMeta(s.Spec) }

func readSkips(path string) ([]skip, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the skip list: %w", err)
	}
	var skips []skip
	if err := yaml.UnmarshalStrict(b, &skips); err != nil {
		return nil, fmt.Errorf("skip list %s: %w", path, err)
	}
	for i, s := range skips {
		if strings.TrimSpace(s.Spec) == "" || strings.TrimSpace(s.Reason) == "" {
			return nil, fmt.Errorf("skip list %s: entry %d needs both a spec and a reason", path, i+1)
		}
	}
	return skips, nil
}

// report is what a run's junit files say about one driver's specs.
type report struct {
	files                  []string
	passed, failed         []string
	suiteSkipped           map[string][]string // reason → specs
	listSkipped, notChosen []string
	names                  []string // every spec of the driver the reports hold
	unmatchedSkips         []skip
	unmatchedSubset        []skip
	seconds                float64
}

// The suite's own runtime skips carry their reason ("skipped - <reason>"); specs that the
// run's focus and skip flags left out carry none.
const runtimeSkipPrefix = "skipped - "

func readReports(files []string, driver string, skips []skip) (*report, error) {
	if len(files) == 0 {
		return nil, errors.New("report: no junit files given")
	}
	prefix := "[Driver: " + driver + "]"
	r := &report{files: files, suiteSkipped: map[string][]string{}}
	used := make([]bool, len(skips))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		var suites reporters.JUnitTestSuites
		if err := xml.Unmarshal(b, &suites); err != nil {
			return nil, fmt.Errorf("parse %s: %w", f, err)
		}
		for _, s := range suites.TestSuites {
			for _, tc := range s.TestCases {
				if !strings.Contains(tc.Name, prefix) {
					continue
				}
				r.seconds += tc.Time
				r.names = append(r.names, tc.Name)
				listed := -1
				for i, sk := range skips {
					if strings.Contains(tc.Name, sk.Spec) {
						listed, used[i] = i, true
						break
					}
				}
				switch {
				case tc.Failure != nil:
					r.failed = append(r.failed, tc.Name+"\n    "+firstLine(tc.Failure.Description))
				case tc.Error != nil:
					r.failed = append(r.failed, tc.Name+"\n    "+firstLine(tc.Error.Description))
				case tc.Skipped == nil:
					r.passed = append(r.passed, tc.Name)
				case strings.HasPrefix(tc.Skipped.Message, runtimeSkipPrefix):
					reason := strings.TrimPrefix(tc.Skipped.Message, runtimeSkipPrefix)
					r.suiteSkipped[reason] = append(r.suiteSkipped[reason], tc.Name)
				case listed >= 0:
					// Each set's report lists every spec: count a name once.
					if !slices.Contains(r.listSkipped, tc.Name) {
						r.listSkipped = append(r.listSkipped, tc.Name)
					}
				default:
					r.notChosen = append(r.notChosen, tc.Name)
				}
			}
		}
	}
	for i, u := range used {
		if !u {
			r.unmatchedSkips = append(r.unmatchedSkips, skips[i])
		}
	}
	return r, nil
}

// checkSubset records the entries of subset that name no spec: a renamed spec would
// otherwise drop out of the subset unnoticed.
func (r *report) checkSubset(subset []skip) {
	for _, e := range subset {
		if !slices.ContainsFunc(r.names, func(n string) bool { return strings.Contains(n, e.Spec) }) {
			r.unmatchedSubset = append(r.unmatchedSubset, e)
		}
	}
}

func (r *report) skippedBySuite() int {
	n := 0
	for _, specs := range r.suiteSkipped {
		n += len(specs)
	}
	return n
}

func (r *report) print(out io.Writer) {
	ran := len(r.passed) + len(r.failed)
	fmt.Fprintf(out, "ran %d, passed %d, failed %d; skipped by the suite %d, by test/conformance/skips.yaml %d; %.0f s of specs (%s)\n",
		ran, len(r.passed), len(r.failed), r.skippedBySuite(), len(r.listSkipped), r.seconds, strings.Join(r.files, ", "))
	reasons := make([]string, 0, len(r.suiteSkipped))
	for reason := range r.suiteSkipped {
		reasons = append(reasons, reason)
	}
	sort.Slice(reasons, func(i, j int) bool { return len(r.suiteSkipped[reasons[i]]) > len(r.suiteSkipped[reasons[j]]) })
	for _, reason := range reasons {
		fmt.Fprintf(out, "  skipped by the suite (%d): %s\n", len(r.suiteSkipped[reason]), firstLine(reason))
	}
	for _, name := range r.failed {
		fmt.Fprintf(out, "FAILED: %s\n", name)
	}
	for _, s := range r.unmatchedSkips {
		fmt.Fprintf(out, "STALE SKIP (matched no spec): %s\n", s.Spec)
	}
	for _, s := range r.unmatchedSubset {
		fmt.Fprintf(out, "STALE SUBSET ENTRY (matched no spec): %s\n", s.Spec)
	}
}

func (r *report) verdict() error {
	switch {
	case len(r.failed) > 0:
		return fmt.Errorf("%d specs failed", len(r.failed))
	case len(r.unmatchedSkips) > 0:
		return fmt.Errorf("%d entries of the skip list matched no spec", len(r.unmatchedSkips))
	case len(r.unmatchedSubset) > 0:
		return fmt.Errorf("%d entries of the subset matched no spec", len(r.unmatchedSubset))
	case len(r.passed) == 0:
		return errors.New("no spec of the driver ran")
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
