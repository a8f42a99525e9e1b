package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A junit file as the e2e framework writes it (-report-dir): passed, failed, skipped by the
// suite with its reason, and left out by the run's flags (message "skipped" alone).
const junit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="2" errors="0" failures="1" time="10">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" disabled="0" skipped="2" errors="0" failures="1" time="10" timestamp="2026-12-03T19:00:00">
    <testcase name="[sig-storage] CSI Volumes [Driver: csi.crdipc.io] [Testpattern: Dynamic PV (default fs)] provisioning should provision storage with mount options" classname="Kubernetes e2e suite" status="passed" time="4"></testcase>
    <testcase name="[sig-storage] CSI Volumes [Driver: csi.crdipc.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data" classname="Kubernetes e2e suite" status="failed" time="6"><failure type="failed">[FAILED] timed out waiting for the condition&#xA;more</failure></testcase>
    <testcase name="[sig-storage] CSI Volumes [Driver: csi.crdipc.io] [Testpattern: Pre-provisioned PV (default fs)] subPath should be able to unmount" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped - Driver csi.crdipc.io doesn&#39;t support PreprovisionedPV -- skipping"></skipped></testcase>
    <testcase name="[sig-storage] CSI Volumes [Driver: csi.crdipc.io] [Testpattern: Dynamic PV (default fs)] capacity provides storage capacity information" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[sig-apps] Deployment should run" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
  </testsuite>
</testsuites>`

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReportCounts(t *testing.T) {
	skips := write(t, "skips.yaml", `- spec: "capacity provides storage capacity information"
  reason: the driver reports no capacity per topology segment
`)
	var out bytes.Buffer
	err := run([]string{"report", "--skips", skips, write(t, "junit_01.xml", junit)}, &out)
	if err == nil || !strings.Contains(err.Error(), "1 specs failed") {
		t.Fatalf("err = %v, want 1 specs failed", err)
	}
	for _, want := range []string{
		"ran 2, passed 1, failed 1; skipped by the suite 1, by test/conformance/skips.yaml 1",
		"skipped by the suite (1): Driver csi.crdipc.io doesn't support PreprovisionedPV",
		"FAILED: [sig-storage] CSI Volumes [Driver: csi.crdipc.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data\n    [FAILED] timed out waiting for the condition\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReportStaleSkip(t *testing.T) {
	skips := write(t, "skips.yaml", `- spec: "a spec the suite renamed"
  reason: whatever
`)
	passing := strings.Replace(junit, `status="failed" time="6"><failure type="failed">[FAILED] timed out waiting for the condition&#xA;more</failure>`, `status="passed" time="6">`, 1)
	var out bytes.Buffer
	err := run([]string{"report", "--skips", skips, write(t, "junit_01.xml", passing)}, &out)
	if err == nil || !strings.Contains(err.Error(), "matched no spec") {
		t.Fatalf("err = %v, want a stale skip:\n%s", err, out.String())
	}
}

func TestSkipsAreLiteral(t *testing.T) {
	skips := write(t, "skips.yaml", `- spec: "[Testpattern: Dynamic PV (ext4)] volumes should allow exec (1.5)"
  reason: r
`)
	var out bytes.Buffer
	if err := run([]string{"skips", skips}, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), `\[Testpattern: Dynamic PV \(ext4\)\] volumes should allow exec \(1\.5\)`+"\n"; got != want {
		t.Errorf("skips printed %q, want %q", got, want)
	}
	bad := write(t, "bad.yaml", `- spec: "x"
`)
	if err := run([]string{"skips", bad}, &out); err == nil || !strings.Contains(err.Error(), "needs both a spec and a reason") {
		t.Errorf("an entry without a reason: err = %v", err)
	}
}

func TestFocusIsOneAlternation(t *testing.T) {
	subset := write(t, "ci.yaml", `- spec: "[Testpattern: Dynamic PV (block volmode)] volumes should store data"
  reason: block
- spec: "[Testpattern: Dynamic PV (xfs)] volumes should store data"
  reason: xfs
`)
	var out bytes.Buffer
	if err := run([]string{"focus", subset}, &out); err != nil {
		t.Fatal(err)
	}
	want := `\[Testpattern: Dynamic PV \(block volmode\)\] volumes should store data|\[Testpattern: Dynamic PV \(xfs\)\] volumes should store data` + "\n"
	if out.String() != want {
		t.Errorf("focus printed %q, want %q", out.String(), want)
	}
}

func TestReportStaleSubsetEntry(t *testing.T) {
	subset := write(t, "ci.yaml", `- spec: "a spec the suite renamed"
  reason: whatever
`)
	passing := strings.Replace(junit, `status="failed" time="6"><failure type="failed">[FAILED] timed out waiting for the condition&#xA;more</failure>`, `status="passed" time="6">`, 1)
	var out bytes.Buffer
	err := run([]string{"report", "--subset", subset, write(t, "junit_01.xml", passing)}, &out)
	if err == nil || !strings.Contains(err.Error(), "entries of the subset matched no spec") {
		t.Fatalf("err = %v, want a stale subset entry:\n%s", err, out.String())
	}
}
