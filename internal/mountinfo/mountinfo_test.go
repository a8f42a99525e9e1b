package mountinfo

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Entry
		ok   bool
	}{
		{`36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`,
			Entry{Dev: "98:0", Root: "/mnt1", MountPoint: "/mnt2", FSType: "ext3", Source: "/dev/root"}, true},
		{`40 36 7:3 / /var/lib/a\040b ro,nodev - ext4 /dev/loop3 ro`,
			Entry{Dev: "7:3", Root: "/", MountPoint: "/var/lib/a b", ReadOnly: true, FSType: "ext4", Source: "/dev/loop3"}, true},
		{`41 36 0:50 / /mnt/fuse rw,nosuid - fuse.volume volume rw`,
			Entry{Dev: "0:50", Root: "/", MountPoint: "/mnt/fuse", FSType: "fuse.volume", Source: "volume"}, true},
		{`36 35 98:0 /mnt1 /mnt2 rw`, Entry{}, false},
		{``, Entry{}, false},
	} {
		got, ok := Parse(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
	if got := Unescape(`a\134b\011c`); got != "a\\b\tc" {
		t.Errorf("Unescape = %q", got)
	}
}
