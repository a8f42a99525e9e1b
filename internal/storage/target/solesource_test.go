package target

import "testing"

// soleSource takes a replica as the source of a volume with fewer than CF complete replicas
// only when every other member rebuilds from it, directly or through other rebuilding
// members (the chaos loop's seed 1795485311291989672 reached r2 from r0, r0 from r1 after
// a crash, and no engine could start again).
func TestSoleSource(t *testing.T) {
	from := func(id string) Info { return Info{Rebuilding: true, RebuildSource: "127.2.0.1:4000/" + id} }
	complete := Info{}
	for _, c := range []struct {
		name string
		all  map[string]Info
		want bool
	}{
		{"both rebuild from it", map[string]Info{"ns/r0": from("ns/r1"), "ns/r1": complete, "ns/r2": from("ns/r1")}, true},
		{"a chain ends at it", map[string]Info{"ns/r0": from("ns/r1"), "ns/r1": complete, "ns/r2": from("ns/r0")}, true},
		{"the only member", map[string]Info{"ns/r1": complete}, true},
		{"another member complete", map[string]Info{"ns/r0": complete, "ns/r1": complete, "ns/r2": from("ns/r1")}, false},
		{"a chain ends at another complete member", map[string]Info{"ns/r0": complete, "ns/r1": complete, "ns/r2": from("ns/r0")}, false},
		{"a cycle", map[string]Info{"ns/r0": from("ns/r2"), "ns/r1": complete, "ns/r2": from("ns/r0")}, false},
		{"filled from a snapshot", map[string]Info{"ns/r0": from("ns/snapshot-copy"), "ns/r1": complete, "ns/r2": from("ns/r1")}, false},
		{"not a member", map[string]Info{"ns/r0": from("ns/r1"), "ns/r2": from("ns/r1")}, false},
		{"no answers", nil, false},
	} {
		if got := soleSource(c.all, "ns/r1"); got != c.want {
			t.Errorf("%s: soleSource(%v, ns/r1) = %v, want %v", c.name, c.all, got, c.want)
		}
	}
}
