package driver

import "testing"

// The holder's names carry the loop device, which nothing else tells the next process; a
// name that is not one of ours, or names a path rather than a device, is left alone.
func TestParseHolderName(t *testing.T) {
	for _, tc := range []struct {
		name, id, loop string
		ok             bool
	}{
		{"csi-target/pvc-1/loop3", "pvc-1", "/dev/loop3", true},
		{"csi-target/pvc-1", "", "", false},
		{"csi-target//loop3", "", "", false},
		{"csi-target/pvc-1/sda", "", "", false},
		{"csi-target/pvc-1/loop3/x", "", "", false},
		{"other/pvc-1/loop3", "", "", false},
	} {
		id, loop, ok := parseHolderName(tc.name)
		if id != tc.id || loop != tc.loop || ok != tc.ok {
			t.Errorf("parseHolderName(%q) = %q, %q, %v; want %q, %q, %v", tc.name, id, loop, ok, tc.id, tc.loop, tc.ok)
		}
	}
}
